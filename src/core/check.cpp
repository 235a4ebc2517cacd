#include "core/check.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include "core/device.h"

namespace moekit::detail {

std::string shape_string(const int64_t* shape, size_t dims) {
  // Plain string appends: no ostringstream (its locale setup costs ~1 us per call).
  std::string s = "[";
  bool first = true;
  for (const int64_t* d = shape; d != shape + dims; ++d) {
    if (!first) s += ", ";
    s += *d == kAnyDim ? std::string("*") : std::to_string(*d);
    first = false;
  }
  s += "]";
  return s;
}

namespace {

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

std::string pointer_string(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

void ArgCheck::fail(const std::string& arg, const std::string& expected,
                    const std::string& got) const {
  throw Error(std::string("moekit::") + op_ + ": argument '" + arg + "': expected " + expected +
              ", got " + got);
}

void ArgCheck::tensor(const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
                      const int64_t* shape, size_t dims, size_t align_bytes) const {
  // Messages are built only on failure: this runs for every tensor of every call.
  if (!t.defined()) {
    fail(name, dtype_list(dtypes) + " tensor of shape " + shape_string(shape, dims),
         "an undefined tensor");
  }
  if (t.ndim < 0 || t.ndim > kMaxDims) {
    fail(name, "0 to " + std::to_string(kMaxDims) + " dimensions", t.describe());
  }
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok |= (d == t.dtype);
  if (!dtype_ok) fail(name, "dtype " + dtype_list(dtypes), t.describe());
  bool shape_ok = t.ndim == static_cast<int>(dims);
  for (size_t d = 0; shape_ok && d < dims; ++d) {
    if (shape[d] != kAnyDim && t.shape[d] != shape[d]) shape_ok = false;
  }
  if (!shape_ok) fail(name, "shape " + shape_string(shape, dims), t.describe());
  // One pass over the dims: sign, byte count (overflow-checked; an empty tensor has 0
  // bytes whatever its other sizes) and row-major strides.
  bool negative = false, huge_dim = false, too_big = false, empty = false, contiguous = true;
  uint64_t bytes = dtype_size(t.dtype);
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    const int64_t n = t.shape[i];
    negative |= n < 0;
    empty |= n == 0;
    huge_dim |= n > kMaxTensorBytes;
    too_big |= __builtin_mul_overflow(bytes, static_cast<uint64_t>(n), &bytes);
    if (n != 1 && t.stride[i] != stride) contiguous = false;
    stride = static_cast<int64_t>(static_cast<uint64_t>(stride) * static_cast<uint64_t>(n));
  }
  if (negative) fail(name, "non-negative sizes", t.describe());
  if (huge_dim) fail(name, "sizes of at most 2^48", t.describe());
  if (!empty && (too_big || bytes > static_cast<uint64_t>(kMaxTensorBytes))) {
    fail(name, "at most 2^48 bytes", t.describe());
  }
  if (!contiguous) fail(name, "a contiguous row-major tensor", "strides that are not");
  if (mode_ == Mode::kShapesOnly) return;
  if (!empty && t.data == nullptr) fail(name, "a non-null data pointer", "nullptr");
  // Alignments are powers of two: a mask, not a 64-bit division.
  const size_t align = align_bytes ? align_bytes : dtype_size(t.dtype);
  if ((reinterpret_cast<uintptr_t>(t.data) & (align - 1)) != 0) {
    fail(name, "data aligned to " + std::to_string(align) + " bytes",
         "pointer " + pointer_string(t.data));
  }
}

void ArgCheck::optional_tensor(const char* name, const TensorView& t,
                               std::initializer_list<DType> dtypes,
                               std::initializer_list<int64_t> shape, size_t align_bytes) const {
  if (t.defined()) tensor(name, t, dtypes, shape, align_bytes);
}

void ArgCheck::same_dtype(const char* name, const TensorView& t, const char* other_name,
                          const TensorView& other) const {
  if (t.dtype != other.dtype) {
    fail(name, std::string("dtype ") + dtype_name(other.dtype) + " (that of '" + other_name + "')",
         t.describe());
  }
}

void ArgCheck::fail_i32(const char* name, const char* what, const TensorView& t) const {
  fail(name, std::string("at most 2^31-1 ") + what + " (the kernels index them in 32 bits)",
       t.describe());
}

void ArgCheck::workspace(const Workspace& ws, size_t needed) const {
  workspace_size(needed);
  if (needed == 0 || mode_ == Mode::kShapesOnly) return;
  if (ws.data == nullptr || ws.bytes < needed) {
    fail("workspace", "at least " + std::to_string(needed) + " bytes",
         ws.data ? std::to_string(ws.bytes) + " bytes" : std::string("no workspace"));
  }
  if (reinterpret_cast<uintptr_t>(ws.data) % 256 != 0) {
    fail("workspace", "data aligned to 256 bytes", "pointer " + pointer_string(ws.data));
  }
}

void ArgCheck::workspace_size(size_t needed) const {
  if (needed > static_cast<size_t>(kMaxTensorBytes)) {
    fail("workspace", "a size of at most 2^48 bytes for these shapes",
         needed == SIZE_MAX ? std::string("a size that overflows 64 bits")
                            : std::to_string(needed) + " bytes");
  }
}

void ArgCheck::fail_overlap(const char* out_name, const TensorView& out, const char* in_name,
                            const TensorView& in, bool in_place_ok) const {
  const auto po = reinterpret_cast<uintptr_t>(out.data), pi = reinterpret_cast<uintptr_t>(in.data);
  const uintptr_t lo = po > pi ? po : pi;
  const uintptr_t hi =
      po + view_bytes(out) < pi + view_bytes(in) ? po + view_bytes(out) : pi + view_bytes(in);
  fail(out_name,
       std::string("memory disjoint from '") + in_name + "'" +
           (in_place_ok ? std::string(" or '") + in_name + "' itself (in place)" : std::string()),
       out.describe() + " at " + pointer_string(out.data) + ", sharing " + std::to_string(hi - lo) +
           " bytes with '" + in_name + "' " + in.describe() + " at " + pointer_string(in.data));
}

void ArgCheck::disjoint_workspace(const Workspace& ws, const char* name,
                                  const TensorView& t) const {
  if (mode_ == Mode::kShapesOnly || ws.data == nullptr || ws.bytes == 0) return;
  if (t.data != nullptr && bytes_overlap(ws.data, ws.bytes, t.data, view_bytes(t))) {
    fail("workspace", std::string("memory disjoint from '") + name + "'",
         std::to_string(ws.bytes) + " bytes at " + pointer_string(ws.data) + ", overlapping '" +
             name + "' " + t.describe() + " at " + pointer_string(t.data));
  }
}

void ArgCheck::disjoint_lists(const Arg* outputs, size_t n_outputs, const Arg* inputs,
                              size_t n_inputs, const Workspace& ws, const Arg* in_place_out,
                              const Arg* in_place_in) const {
  if (mode_ == Mode::kShapesOnly) return;
  // Each argument's byte range once (empty: lo == hi), then plain comparisons; the
  // messages are built by the disjoint* calls, on failure only.
  struct Range {
    uintptr_t lo, hi;
    bool meets(const Range& o) const { return lo < o.hi && o.lo < hi; }
  };
  auto range = [](const TensorView& t) {
    const auto p = reinterpret_cast<uintptr_t>(t.data);
    return Range{p, t.data ? p + view_bytes(t) : p};
  };
  // On the stack for the ops' lists (a call allocates nothing), on the heap beyond.
  constexpr size_t kOnStack = 32;
  Range on_stack[kOnStack];
  std::vector<Range> on_heap;
  Range* in_r = on_stack;
  if (n_inputs + n_outputs > kOnStack) {
    on_heap.resize(n_inputs + n_outputs);
    in_r = on_heap.data();
  }
  Range* out_r = in_r + n_inputs;
  for (size_t i = 0; i < n_inputs; ++i) in_r[i] = range(inputs[i].t);
  const auto w = reinterpret_cast<uintptr_t>(ws.data);
  const Range ws_r{w, ws.data ? w + ws.bytes : w};
  for (size_t o = 0; o < n_outputs; ++o) {
    const Arg& out = outputs[o];
    const Range r = range(out.t);
    for (size_t i = 0; i < n_inputs; ++i) {
      if (!r.meets(in_r[i])) continue;
      const Arg& in = inputs[i];
      if (in_place_out && &in_place_out->t == &out.t && &in_place_in->t == &in.t) {
        disjoint_or_same(out.name, out.t, in.name, in.t);
      } else {
        disjoint(out.name, out.t, in.name, in.t);
      }
    }
    for (size_t i = 0; i < o; ++i) {
      if (r.meets(out_r[i])) disjoint(out.name, out.t, outputs[i].name, outputs[i].t);
    }
    if (r.meets(ws_r)) disjoint_workspace(ws, out.name, out.t);
    out_r[o] = r;
  }
  for (size_t i = 0; i < n_inputs; ++i) {
    if (in_r[i].meets(ws_r)) disjoint_workspace(ws, inputs[i].name, inputs[i].t);
  }
}

// ---- launch targets ----

namespace {

thread_local int t_composite_depth = 0;

// A few (key, device) pairs already found good on this thread; round-robin replacement.
// A stale entry (memory freed and reallocated on another device at the same address, a
// stream destroyed and its handle reused) only skips a check: the call then behaves as
// it would without one.
struct TargetCache {
  static constexpr int kSlots = 8;
  const void* key[kSlots] = {};
  int device[kSlots] = {};
  int next = 0;

  bool has(const void* k, int dev) const {
    for (int i = 0; i < kSlots; ++i) {
      if (key[i] == k && device[i] == dev) return true;
    }
    return false;
  }
  void add(const void* k, int dev) {
    key[next] = k;
    device[next] = dev;
    next = (next + 1) % kSlots;
  }
};
thread_local TargetCache t_good_streams;
thread_local TargetCache t_good_outputs;

std::string cuda_device(int dev) {
  return "cuda:" + std::to_string(dev);
}

// The queries below are pure lookups, but a thread capturing a stream in global or
// thread-local mode may be refused "potentially unsafe" calls (which would invalidate
// the capture): they run with this thread in relaxed capture mode, restored after.
class RelaxedCapture {
 public:
  RelaxedCapture() { ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
  ~RelaxedCapture() {
    if (ok_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_ = false;
};

}  // namespace

CompositeScope::CompositeScope() {
  ++t_composite_depth;
}

CompositeScope::~CompositeScope() {
  --t_composite_depth;
}

void ArgCheck::launch_target(cudaStream_t stream, const char* out_name,
                             const TensorView& out) const {
  if (mode_ == Mode::kShapesOnly || t_composite_depth > 0) return;
  int dev = -1;
  const cudaError_t dev_err = cudaGetDevice(&dev);
  if (dev_err != cudaSuccess) {
    cudaGetLastError();
    fail("stream", "a CUDA device to launch on",
         std::string("none: cudaGetDevice says '") + cudaGetErrorString(dev_err) + "'");
  }
  // The legacy and per-thread default streams belong to the current device.
  const bool default_stream =
      stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
  // While the stream is being captured, cudaStreamGetDevice and cudaPointerGetAttributes
  // are refused and invalidate the capture, relaxed mode or not (H200, CUDA 13): a captured
  // call is checked only against what eager calls cached.
  if (!default_stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      cudaGetLastError();
    } else if (capture != cudaStreamCaptureStatusNone) {
      return;
    }
  }
  if (!default_stream && !t_good_streams.has(stream, dev)) {
    int stream_dev = -1;
    cudaError_t err;
    {
      RelaxedCapture relaxed;
      err = cudaStreamGetDevice(stream, &stream_dev);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("stream", "a valid CUDA stream",
           "handle " + pointer_string(stream) + " (cudaStreamGetDevice says '" +
               cudaGetErrorString(err) + "')");
    }
    if (stream_dev != dev) {
      fail("stream", "a stream of the current device " + cuda_device(dev),
           "a stream of " + cuda_device(stream_dev));
    }
    t_good_streams.add(stream, dev);
  }
  if (!out.defined() || out.data == nullptr || out.numel() == 0 ||
      t_good_outputs.has(out.data, dev)) {
    return;
  }
  cudaPointerAttributes attr{};
  cudaError_t err;
  bool host_reachable = false;  // pageable host memory the device can access
  {
    RelaxedCapture relaxed;
    err = cudaPointerGetAttributes(&attr, out.data);
    if (err == cudaSuccess && attr.type == cudaMemoryTypeUnregistered) {
      host_reachable = device_props().pageable_access;
    }
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(out_name, "memory the kernels on " + cuda_device(dev) + " can write",
         "pointer " + pointer_string(out.data) + " (cudaPointerGetAttributes says '" +
             cudaGetErrorString(err) + "')");
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != dev) {
    fail(out_name, "memory on the current device " + cuda_device(dev) + ", where the kernels run",
         "memory on " + cuda_device(attr.device));
  }
  if (attr.type == cudaMemoryTypeUnregistered && !host_reachable) {
    fail(out_name, "device memory (or managed or pinned host memory)",
         "host memory CUDA did not allocate at " + pointer_string(out.data));
  }
  t_good_outputs.add(out.data, dev);
}

std::string rename_error(const char* op, const std::string& message) {
  const std::string prefix = "moekit::";
  const std::string own = prefix + op + ":";
  if (message.compare(0, own.size(), own) == 0) return message;
  if (message.compare(0, prefix.size(), prefix) == 0) {
    const size_t colon = message.find(':', prefix.size());
    if (colon != std::string::npos) {
      return own + " in " + message.substr(prefix.size(), colon - prefix.size()) +
             message.substr(colon);
    }
  }
  const std::string bare = "moekit: ";
  if (message.compare(0, bare.size(), bare) == 0) return own + " " + message.substr(bare.size());
  return own + " " + message;
}

void check_launch(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(std::string("moekit::") + op + ": CUDA launch failed: " + cudaGetErrorString(err));
  }
}

}  // namespace moekit::detail
