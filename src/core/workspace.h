// Carving one caller-given workspace into aligned sub-buffers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moekit::detail {

// Carves 256-byte-aligned sub-buffers out of a workspace in a fixed order. With a
// null base it only counts, so *_workspace_size and the ops share one layout.
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(size_t bytes) {
    void* p = base_ ? base_ + offset_ : nullptr;
    // Saturates at SIZE_MAX (a size query then reports the overflow, ArgCheck::
    // workspace_size) instead of wrapping.
    const size_t rounded = bytes > SIZE_MAX - 255 ? SIZE_MAX : (bytes + 255) / 256 * 256;
    offset_ = offset_ > SIZE_MAX - rounded ? SIZE_MAX : offset_ + rounded;
    return p;
  }
  size_t bytes() const { return offset_; }

 private:
  char* base_;
  size_t offset_ = 0;
};

}  // namespace moekit::detail
