// Running one sweep case on the device: inputs, the op run twice on poisoned outputs and
// workspaces, the byte comparison of the two runs, the contract checks (every valid row
// written, padding untouched) and the comparison against the reference.
#pragma once

#include <cuda_runtime_api.h>

#include <deque>
#include <string>
#include <vector>

#include "moekit/tensor.h"
#include "reference/host_tensor.h"
#include "sweep_case.h"
#include "sweep_device.h"
#include "sweep_outcome.h"

namespace moekit::sweep {

// A device tensor of the current case (arena memory).
struct DevTensor {
  void* data = nullptr;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t row_elems() const { return shape.size() > 1 ? shape.back() : 1; }
  int64_t rows() const { return row_elems() > 0 ? numel() / row_elems() : 0; }
  TensorView view() const;
  bool defined() const { return dtype != DType::kUndefined; }
};

class Context {
 public:
  Context(size_t arena_bytes, double hang_seconds);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  cudaStream_t stream() const { return stream_; }
  Arena& arena() { return arena_; }
  // Arena memory for this case (contents undefined).
  DevTensor tensor(DType dtype, std::vector<int64_t> shape);
  Workspace workspace(size_t bytes);
  DevTensor upload(DType dtype, std::vector<int64_t> shape, const void* host);
  // Waits for the stream: a CUDA error throws CudaFault; past the hang limit the process
  // ends (exit 124) naming `what` and the case (`current`).
  void sync(const char* what);
  HostTensor to_host(const DevTensor& t);
  // Four device counters, zeroed on the stream; read() syncs.
  unsigned long long* counters();
  void read_counters(unsigned long long out[4]);

  std::string current;  // the running case's reproduce line

 private:
  Arena arena_;
  double hang_seconds_;
  cudaStream_t stream_ = nullptr;
  unsigned long long* counters_ = nullptr;
};

// The outputs (poisoned before each run, compared byte for byte between the runs), the
// workspace (filled with a different byte before each run: results must not depend on
// it) and the call.
struct RunPlan {
  std::vector<const DevTensor*> outputs;
  Workspace workspace;
  std::function<void(cudaStream_t)> launch;
};
void run_twice(Context& ctx, const RunPlan& plan, Outcome& o);

// ---- checks -------------------------------------------------------------------------------

// Up to `max` of the indices, evenly spaced, the first and the last included.
std::vector<int64_t> sample(const std::vector<int64_t>& candidates, int64_t max);
std::vector<int64_t> sample_range(int64_t n, int64_t max);
// Row mask (one byte per row) of the given rows.
std::vector<uint8_t> row_mask(int64_t rows, const std::vector<int64_t>& picked);
const uint8_t* device_mask(Context& ctx, const std::vector<uint8_t>& mask);

// Compact copies [rows.size(), row_elems] of the given rows.
HostTensor gather(Context& ctx, const DevTensor& t, const std::vector<int64_t>& rows);
HostTensor gather(const HostTensor& t, const std::vector<int64_t>& rows);

// Rows of `valid` (null: all) must hold no NaN/Inf; the others must keep the poison.
void scan_output(Context& ctx, Outcome& o, const char* name, const DevTensor& t,
                 const std::vector<uint8_t>* valid);
// SPEC accuracy rule with the tolerance of `tol`: rel_l2 and err_ratio within its limit.
void compare_rows(Outcome& o, const char* name, const HostTensor& out, const HostTensor& ref,
                  DType tol);
// Integer outputs: equal element for element.
void compare_exact(Outcome& o, const char* name, const int32_t* out, const int32_t* ref, int64_t n);

// Host copies of device inputs and poisoned host outputs, for the CPU references.
class HostMirror {
 public:
  explicit HostMirror(Context& ctx) : ctx_(ctx) {}
  TensorView in(const TensorView& device_view);  // undefined stays undefined
  TensorView out(const TensorView& device_view, HostTensor** tensor = nullptr);

 private:
  Context& ctx_;
  std::deque<HostTensor> keep_;
};

// The seed of one input tensor of a case.
uint64_t input_seed(const SweepCase& c, int tag);
// A case small enough for the CPU f64 references.
bool cpu_reference_fits(const SweepCase& c);
// Rows the reference comparison takes at most per case.
constexpr int64_t kCheckRows = 512;

// ---- the ops (sweep_ops_*.cpp) -------------------------------------------------------------

void run_routing_op(Context& ctx, const SweepCase& c, Outcome& o);
void run_gemm_op(Context& ctx, const SweepCase& c, Outcome& o);
void run_moe_op(Context& ctx, const SweepCase& c, Outcome& o);

// One case: every input from its seed, the op under the case's forced paths, all checks.
// A moekit::Error from the op is a failure; a CudaFault propagates (the sweep stops).
Outcome run_case(Context& ctx, const SweepCase& c);

}  // namespace moekit::sweep
