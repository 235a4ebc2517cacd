// Argument validation shared by every op. Each failure throws moekit::Error with
// "<op>: argument '<name>': expected <...>, got <...>". docs/bad-inputs.md lists what
// each op refuses.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include "moekit/error.h"
#include "moekit/tensor.h"

namespace moekit::detail {

constexpr int64_t kAnyDim = -1;  // wildcard in an expected shape

// The largest tensor (and workspace) an op takes, in bytes: more than any device holds,
// and small enough that every size product of validated shapes stays inside 64 bits.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 48;

std::string shape_string(const int64_t* shape, size_t dims);

class ArgCheck {
 public:
  // kCall: an op's call (pointers checked too). kShapesOnly: a *_workspace_size query,
  // which may get null pointers: shapes, dtypes and sizes only.
  enum class Mode { kCall, kShapesOnly };

  explicit ArgCheck(const char* op, Mode mode = Mode::kCall) : op_(op), mode_(mode) {}

  [[noreturn]] void fail(const std::string& arg, const std::string& expected,
                         const std::string& got) const;

  // A required tensor: defined, 0..kMaxDims dims, one of `dtypes`, the given shape
  // (kAnyDim matches anything), non-negative sizes, at most kMaxTensorBytes, contiguous,
  // and (kCall) non-null when non-empty with data aligned to `align_bytes` (0 = the
  // dtype's natural alignment).
  void tensor(const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
              std::initializer_list<int64_t> shape, size_t align_bytes = 0) const {
    tensor(name, t, dtypes, shape.begin(), shape.size(), align_bytes);
  }
  // The same with a computed shape (weight_scale_shape).
  void tensor(const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
              const std::vector<int64_t>& shape, size_t align_bytes = 0) const {
    tensor(name, t, dtypes, shape.data(), shape.size(), align_bytes);
  }
  // The same checks, only when `t` is defined.
  void optional_tensor(const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
                       std::initializer_list<int64_t> shape, size_t align_bytes = 0) const;
  // A tensor whose dtype must equal another argument's.
  void same_dtype(const char* name, const TensorView& t, const char* other_name,
                  const TensorView& other) const;
  // A scalar condition: when !ok, fail(name, expected, got).
  void require(bool ok, const char* name, const std::string& expected,
               const std::string& got) const {
    if (!ok) fail(name, expected, got);
  }
  // A size the kernels hold in 32-bit ints (row counts, TMA coordinates): at most
  // 2^31-1; `what` names it in the message ("rows (dim 0)").
  void fits_i32(int64_t value, const char* name, const char* what, const TensorView& t) const {
    if (value > INT32_MAX) fail_i32(name, what, t);
  }
  // `needed` at most kMaxTensorBytes (workspace_size), then a workspace of at least
  // `needed` bytes (skipped when needed == 0), 256-byte aligned (kShapesOnly: skipped).
  void workspace(const Workspace& ws, size_t needed) const;
  // A workspace size at most kMaxTensorBytes (shapes that need more are refused).
  void workspace_size(size_t needed) const;

  // An output that must not share a byte with an input (or another output). Undefined or
  // empty views overlap nothing. kShapesOnly: skipped.
  void disjoint(const char* out_name, const TensorView& out, const char* in_name,
                const TensorView& in) const {
    if (mode_ == Mode::kCall && ranges_overlap(out, in)) fail_overlap(out_name, out, in_name, in);
  }
  // The same, but `out` may be `in` itself (same data pointer and size): in place.
  void disjoint_or_same(const char* out_name, const TensorView& out, const char* in_name,
                        const TensorView& in) const {
    if (mode_ == Mode::kCall && ranges_overlap(out, in) &&
        !(out.data == in.data && view_bytes(out) == view_bytes(in))) {
      fail_overlap(out_name, out, in_name, in, /*in_place_ok=*/true);
    }
  }
  // The workspace must not share a byte with a tensor argument.
  void disjoint_workspace(const Workspace& ws, const char* name, const TensorView& t) const;

  struct Arg {
    const char* name;
    const TensorView& t;
  };
  // The memory rule of most ops: no output shares a byte with an input or another
  // output, and the workspace none with any of them. `in_place` (optional): an output
  // and an input it may also be exactly (disjoint_or_same). Pairs are checked in list
  // order; the first overlap found is reported.
  void outputs_disjoint(std::initializer_list<Arg> outputs, std::initializer_list<Arg> inputs,
                        const Workspace& ws = Workspace{}, const Arg* in_place_out = nullptr,
                        const Arg* in_place_in = nullptr) const {
    disjoint_lists(outputs.begin(), outputs.size(), inputs.begin(), inputs.size(), ws, in_place_out,
                   in_place_in);
  }
  // The same with the inputs built by join().
  template <size_t N>
  void outputs_disjoint(std::initializer_list<Arg> outputs, const std::array<Arg, N>& inputs,
                        const Workspace& ws = Workspace{}, const Arg* in_place_out = nullptr,
                        const Arg* in_place_in = nullptr) const {
    disjoint_lists(outputs.begin(), outputs.size(), inputs.data(), N, ws, in_place_out,
                   in_place_in);
  }
  // An argument list joined in order from parts, each an Arg or a std::array of Args: ops
  // whose lists share a group of arguments splice it in (moe_validate.h weight_args).
  template <class... Parts>
  static auto join(const Parts&... parts) {
    return std::apply([](const auto&... a) { return std::array<Arg, sizeof...(a)>{a...}; },
                      std::tuple_cat(as_tuple(parts)...));
  }

  // Before an op's first launch (call it only when something will be launched): there
  // is a current CUDA device, `stream` belongs to it (a launch into another device's
  // stream fails) and `out` is memory its kernels can write (that device's memory,
  // managed or pinned host memory, or any host memory where the device can access
  // pageable memory). Positive answers are cached per thread (a few streams and pointers
  // per device), so a steady-state call makes no CUDA query. Skipped inside a composite
  // op (run_composite): the outer op checked. kShapesOnly: skipped.
  void launch_target(cudaStream_t stream, const char* out_name, const TensorView& out) const;

  const char* op() const { return op_; }

 private:
  void tensor(const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
              const int64_t* shape, size_t dims, size_t align_bytes) const;
  // outputs_disjoint over arrays (any length).
  void disjoint_lists(const Arg* outputs, size_t n_outputs, const Arg* inputs, size_t n_inputs,
                      const Workspace& ws, const Arg* in_place_out, const Arg* in_place_in) const;
  static std::tuple<Arg> as_tuple(const Arg& a) { return std::tuple<Arg>(a); }
  template <size_t N>
  static const std::array<Arg, N>& as_tuple(const std::array<Arg, N>& a) {
    return a;
  }

  // Bytes of a validated view (inline: these run for every pair of every call).
  static uint64_t view_bytes(const TensorView& t) {
    static constexpr uint8_t kSize[] = {0, 2, 2, 4, 4, 1, 8};  // by DType
    const auto code = static_cast<unsigned>(t.dtype);
    uint64_t n = code < sizeof kSize ? kSize[code] : 0;
    for (int i = 0; i < t.ndim && i < kMaxDims; ++i) n *= static_cast<uint64_t>(t.shape[i]);
    return n;
  }
  static bool ranges_overlap(const TensorView& a, const TensorView& b) {
    return a.data != nullptr && b.data != nullptr &&
           bytes_overlap(a.data, view_bytes(a), b.data, view_bytes(b));
  }
  static bool bytes_overlap(const void* a, uint64_t na, const void* b, uint64_t nb) {
    const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
  }
  [[noreturn]] void fail_overlap(const char* out_name, const TensorView& out, const char* in_name,
                                 const TensorView& in, bool in_place_ok = false) const;
  [[noreturn]] void fail_i32(const char* name, const char* what, const TensorView& t) const;

  const char* op_;
  Mode mode_;
};

// ArgCheck::require whose message arguments are evaluated only when `ok` is false: the
// success path of a call builds no strings (std::to_string, describe()). Prefer it to
// require() wherever the message is computed.
#define MOEKIT_REQUIRE(check, ok, name, expected, got) \
  do {                                                 \
    if (!(ok)) (check).fail(name, expected, got);      \
  } while (0)

// Throws moekit::Error naming the op when the last launch failed.
void check_launch(const char* op);

// While alive (per thread), ArgCheck::launch_target is skipped: the launches of a
// composite op, which checked its own launch target.
class CompositeScope {
 public:
  CompositeScope();
  ~CompositeScope();
  CompositeScope(const CompositeScope&) = delete;
  CompositeScope& operator=(const CompositeScope&) = delete;
};

// `message` of an error raised inside composite op `op`, naming `op` first:
// "moekit::<inner>: <rest>" -> "moekit::<op>: in <inner>: <rest>"; "moekit: <rest>" ->
// "moekit::<op>: <rest>"; a message that already names `op` is kept.
std::string rename_error(const char* op, const std::string& message);

// Runs the launches of composite op `op` (one whose launches go through other ops or
// launch paths that name themselves): their launch-target checks are skipped, and a
// moekit::Error they throw is rethrown naming `op` (rename_error), so the caller reads
// the op it called.
template <class Fn>
void run_composite(const char* op, Fn&& launches) {
  CompositeScope scope;
  try {
    launches();
  } catch (const Error& e) {
    throw Error(rename_error(op, e.what()));
  }
}

}  // namespace moekit::detail
