#include "sweep_run.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "moekit/error.h"
#include "reference/accuracy.h"
#include "sweep_paths.h"

namespace moekit::sweep {

int64_t DevTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TensorView DevTensor::view() const {
  if (!defined()) return TensorView{};
  return make_view(data, dtype, static_cast<int>(shape.size()), shape.data());
}

Context::Context(size_t arena_bytes, double hang_seconds)
    : arena_(arena_bytes), hang_seconds_(hang_seconds) {
  // A blocking stream: it also orders against anything issued on the legacy default stream.
  cuda_ok(cudaStreamCreate(&stream_), "cudaStreamCreate");
  cuda_ok(cudaMalloc(reinterpret_cast<void**>(&counters_), 4 * sizeof(unsigned long long)),
          "cudaMalloc(counters)");
}

Context::~Context() {
  cudaFree(counters_);
  cudaStreamDestroy(stream_);
}

DevTensor Context::tensor(DType dtype, std::vector<int64_t> shape) {
  DevTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = arena_.take(t.bytes());
  return t;
}

Workspace Context::workspace(size_t bytes) {
  if (bytes == 0) return {};
  return {arena_.take(bytes), bytes};
}

DevTensor Context::upload(DType dtype, std::vector<int64_t> shape, const void* host) {
  DevTensor t = tensor(dtype, std::move(shape));
  // From pageable memory the copy is staged before the call returns: `host` may go away.
  if (t.bytes()) {
    cuda_ok(cudaMemcpyAsync(t.data, host, t.bytes(), cudaMemcpyHostToDevice, stream_), "upload");
  }
  return t;
}

void Context::sync(const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) cuda_ok(e, what);
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > hang_seconds_) {
      std::fprintf(stderr, "\nHANG: %s still running after %.0f s\n  %s\n", what, hang_seconds_,
                   current.c_str());
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(124);
    }
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

HostTensor Context::to_host(const DevTensor& t) {
  HostTensor h(t.dtype, t.shape);
  if (t.bytes()) {
    cuda_ok(cudaMemcpyAsync(h.data(), t.data, t.bytes(), cudaMemcpyDeviceToHost, stream_),
            "download");
    sync("download");
  }
  return h;
}

unsigned long long* Context::counters() {
  cuda_ok(cudaMemsetAsync(counters_, 0, 4 * sizeof(unsigned long long), stream_), "counters");
  return counters_;
}

void Context::read_counters(unsigned long long out[4]) {
  cuda_ok(cudaMemcpyAsync(out, counters_, 4 * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                          stream_),
          "counters");
  sync("counters");
}

void run_twice(Context& ctx, const RunPlan& plan, Outcome& o) {
  const cudaStream_t s = ctx.stream();
  std::vector<void*> first;
  for (const DevTensor* t : plan.outputs) first.push_back(ctx.arena().take(t->bytes()));
  for (int run = 0; run < 2; ++run) {
    for (const DevTensor* t : plan.outputs) {
      cuda_ok(cudaMemsetAsync(t->data, 0xFF, t->bytes(), s), "poison");
    }
    if (plan.workspace.bytes) {
      cuda_ok(cudaMemsetAsync(plan.workspace.data, run == 0 ? 0xFF : 0x5A, plan.workspace.bytes, s),
              "workspace fill");
    }
    plan.launch(s);
    ctx.sync(run == 0 ? "the op" : "the op's second run");
    for (size_t i = 0; run == 0 && i < plan.outputs.size(); ++i) {
      cuda_ok(cudaMemcpyAsync(first[i], plan.outputs[i]->data, plan.outputs[i]->bytes(),
                              cudaMemcpyDeviceToDevice, s),
              "copy of the first run");
    }
  }
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    unsigned long long* n = ctx.counters();
    diff_bytes(first[i], plan.outputs[i]->data, plan.outputs[i]->bytes(), n, s);
    unsigned long long got[4];
    ctx.read_counters(got);
    if (got[0]) {
      o.identical = false;
      o.problems.push_back("rerun: " + std::to_string(got[0]) + " of " +
                           std::to_string(plan.outputs[i]->bytes()) + " bytes of output " +
                           std::to_string(i) + " differ");
    }
  }
}

std::vector<int64_t> sample(const std::vector<int64_t>& v, int64_t max) {
  const int64_t n = static_cast<int64_t>(v.size());
  if (n <= max) return v;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < max; ++i) {
    const int64_t at = max > 1 ? i * (n - 1) / (max - 1) : 0;
    if (out.empty() || v[at] != out.back()) out.push_back(v[at]);
  }
  return out;
}

std::vector<int64_t> sample_range(int64_t n, int64_t max) {
  std::vector<int64_t> out;
  if (n <= max) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int64_t i = 0; i < max; ++i) {
    const int64_t at = max > 1 ? i * (n - 1) / (max - 1) : 0;
    if (out.empty() || at != out.back()) out.push_back(at);
  }
  return out;
}

std::vector<uint8_t> row_mask(int64_t rows, const std::vector<int64_t>& picked) {
  std::vector<uint8_t> m(static_cast<size_t>(std::max<int64_t>(rows, 0)), 0);
  for (int64_t r : picked) m[r] = 1;
  return m;
}

const uint8_t* device_mask(Context& ctx, const std::vector<uint8_t>& mask) {
  void* d = ctx.arena().take(mask.size());
  if (!mask.empty()) {
    cuda_ok(cudaMemcpyAsync(d, mask.data(), mask.size(), cudaMemcpyHostToDevice, ctx.stream()),
            "mask upload");
  }
  return static_cast<const uint8_t*>(d);
}

HostTensor gather(Context& ctx, const DevTensor& t, const std::vector<int64_t>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  HostTensor h(t.dtype, {n, t.row_elems()});
  const size_t row_bytes = static_cast<size_t>(t.row_elems()) * dtype_size(t.dtype);
  if (n == 0 || row_bytes == 0) return h;
  const DevTensor idx = ctx.upload(DType::kI32, {2 * n}, rows.data());  // int64 rows
  void* dst = ctx.arena().take(row_bytes * n);
  gather_rows(t.data, row_bytes, static_cast<const int64_t*>(idx.data), n, dst, ctx.stream());
  cuda_ok(cudaMemcpyAsync(h.data(), dst, row_bytes * n, cudaMemcpyDeviceToHost, ctx.stream()),
          "gather");
  ctx.sync("gather");
  return h;
}

HostTensor gather(const HostTensor& t, const std::vector<int64_t>& rows) {
  const int64_t row = t.shape().size() > 1 ? t.shape().back() : 1;
  const int64_t n = static_cast<int64_t>(rows.size());
  HostTensor h(t.dtype(), {n, row});
  const size_t row_bytes = static_cast<size_t>(row) * dtype_size(t.dtype());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(static_cast<char*>(h.data()) + i * row_bytes,
                static_cast<const char*>(t.data()) + rows[i] * row_bytes, row_bytes);
  }
  return h;
}

void scan_output(Context& ctx, Outcome& o, const char* name, const DevTensor& t,
                 const std::vector<uint8_t>* valid) {
  const uint8_t* mask = valid ? device_mask(ctx, *valid) : nullptr;
  unsigned long long* n = ctx.counters();
  scan_rows(t.data, t.dtype, t.rows(), t.row_elems(), mask, n, ctx.stream());
  unsigned long long got[4];
  ctx.read_counters(got);
  if (got[0]) o.fail(std::string(name) + ": " + std::to_string(got[0]) + " NaN/Inf in valid rows");
  if (got[1]) {
    o.fail(std::string(name) + ": " + std::to_string(got[1]) +
           " bytes written outside every valid row");
  }
}

void compare_rows(Outcome& o, const char* name, const HostTensor& out, const HostTensor& ref,
                  DType tol_dtype) {
  const Tolerance tol = tolerance_for(tol_dtype);
  const Accuracy a = compare(out.view(), ref.view(), tol);
  if (!a.pass(tol)) {
    o.fail(std::string(name) + ": " + a.str() + " over " + std::to_string(a.count) +
           " elements (limit " + std::to_string(tol.max_rel_l2) + ")");
  }
}

void compare_exact(Outcome& o, const char* name, const int32_t* out, const int32_t* ref,
                   int64_t n) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (out[i] != ref[i]) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad) {
    o.fail(std::string(name) + ": " + std::to_string(bad) + " of " + std::to_string(n) +
           " values differ (first at " + std::to_string(first) + ": " + std::to_string(out[first]) +
           " vs " + std::to_string(ref[first]) + ")");
  }
}

TensorView HostMirror::in(const TensorView& v) {
  if (!v.defined()) return v;
  std::vector<int64_t> shape(v.shape, v.shape + v.ndim);
  keep_.emplace_back(v.dtype, shape);
  HostTensor& h = keep_.back();
  if (h.nbytes()) {
    cuda_ok(cudaMemcpyAsync(h.data(), v.data, h.nbytes(), cudaMemcpyDeviceToHost, ctx_.stream()),
            "mirror");
    ctx_.sync("mirror");
  }
  return h.view();
}

TensorView HostMirror::out(const TensorView& v, HostTensor** tensor) {
  std::vector<int64_t> shape(v.shape, v.shape + v.ndim);
  keep_.emplace_back(v.dtype, shape);
  keep_.back().fill_bytes(0xFF);
  if (tensor) *tensor = &keep_.back();
  return keep_.back().view();
}

uint64_t input_seed(const SweepCase& c, int tag) {
  uint64_t x = c.data_seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(tag + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool cpu_reference_fits(const SweepCase& c) {
  return case_flops(c) <= 4e6 && case_bytes(c) <= 4e6;
}

Outcome run_case(Context& ctx, const SweepCase& c) {
  Outcome o;
  ctx.arena().reset();
  ForcedPaths forced(c.knobs);
  o.path = path_taken(c);
  const int64_t chains = chain_launches();
  try {
    switch (c.op) {
      case Op::kFusedTopK:
      case Op::kPermuteAlign:
      case Op::kPrePermute:
      case Op::kPostPermute:
        run_routing_op(ctx, c, o);
        break;
      case Op::kGroupedGemm:
      case Op::kGroupedGemmFp8:
      case Op::kExpertMlp:
        run_gemm_op(ctx, c, o);
        break;
      default:
        run_moe_op(ctx, c, o);
        break;
    }
  } catch (const Error& e) {
    // A refused valid input or a failed launch. A launch error may leave the context
    // broken: a sync tells (CudaFault then stops the sweep).
    o.fail(std::string("moekit::Error: ") + e.what());
    ctx.sync("after an error");
  }
  const int64_t chained = chain_launches() - chains;
  if (chained > 0 && o.path.find("chain") == std::string::npos) {
    o.path += " (chain ran)";
  } else if (chained == 0 && o.path.find("chain") != std::string::npos) {
    o.path += " (no chain ran)";
  }
  return o;
}

}  // namespace moekit::sweep
