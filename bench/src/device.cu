#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "device.h"
#include "moekit/error.h"

namespace moekit::bench {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

DType parse_dtype(const std::string& n) {
  if (n == "bf16") return DType::kBF16;
  if (n == "f16") return DType::kF16;
  if (n == "f32") return DType::kF32;
  if (n == "i32") return DType::kI32;
  if (n == "fp8e4m3") return DType::kFP8E4M3;
  throw std::runtime_error("unknown dtype '" + n + "'");
}

// ---- DTensor / DBuffer ------------------------------------------------------------------

namespace {
size_t round256(size_t b) {
  return (b + 255) / 256 * 256;
}
}  // namespace

DTensor::DTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  bytes_ = static_cast<size_t>(numel()) * dtype_size(dtype_);
  stride_ = round256(std::max<size_t>(bytes_, 1));
  BENCH_CUDA(cudaMalloc(&base_, stride_));
}

DTensor::~DTensor() {
  release();
}

void DTensor::release() {
  if (base_) cudaFree(base_);
  base_ = nullptr;
}

DTensor::DTensor(DTensor&& o) noexcept {
  *this = std::move(o);
}

DTensor& DTensor::operator=(DTensor&& o) noexcept {
  if (this != &o) {
    release();
    base_ = o.base_;
    bytes_ = o.bytes_;
    stride_ = o.stride_;
    copies_ = o.copies_;
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    o.base_ = nullptr;
    o.dtype_ = DType::kUndefined;
  }
  return *this;
}

int64_t DTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

void* DTensor::data(int copy) const {
  return static_cast<char*>(base_) + static_cast<size_t>(copy % copies_) * stride_;
}

TensorView DTensor::view(int copy) const {
  if (!defined()) return TensorView{};
  return make_view(data(copy), dtype_, static_cast<int>(shape_.size()), shape_.data());
}

void DTensor::set_copies(int n) {
  if (n <= 1 || n == copies_ || !base_) return;
  void* fresh = nullptr;
  BENCH_CUDA(cudaMalloc(&fresh, stride_ * n));
  for (int c = 0; c < n; ++c)
    BENCH_CUDA(cudaMemcpy(static_cast<char*>(fresh) + c * stride_, base_, stride_,
                          cudaMemcpyDeviceToDevice));
  release();
  base_ = fresh;
  copies_ = n;
}

HostTensor DTensor::download(int copy) const {
  HostTensor h(dtype_, shape_);
  if (h.nbytes()) BENCH_CUDA(cudaMemcpy(h.data(), data(copy), h.nbytes(), cudaMemcpyDeviceToHost));
  return h;
}

void DTensor::upload(const HostTensor& h) {
  if (h.nbytes() != bytes_) throw std::runtime_error("DTensor::upload: size mismatch");
  if (bytes_) BENCH_CUDA(cudaMemcpy(base_, h.data(), bytes_, cudaMemcpyHostToDevice));
}

void DTensor::fill_bytes(uint8_t byte) {
  if (base_) BENCH_CUDA(cudaMemset(base_, byte, stride_ * copies_));
}

DBuffer::DBuffer(size_t bytes) : bytes_(bytes) {
  BENCH_CUDA(cudaMalloc(&data_, std::max<size_t>(bytes, 256)));
}
DBuffer::~DBuffer() {
  if (data_) cudaFree(data_);
}
DBuffer::DBuffer(DBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
  o.data_ = nullptr;
}
DBuffer& DBuffer::operator=(DBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) cudaFree(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
  }
  return *this;
}

// ---- RNG ---------------------------------------------------------------------------------

namespace {

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ void put(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void put(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void put(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void put(__nv_fp8_e4m3* p, int64_t i, float v) {
  p[i] = __nv_fp8_e4m3(v);  // round to nearest, saturating to +-448
}
__device__ __forceinline__ float get(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float get(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
__device__ __forceinline__ float get(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

template <class T>
__global__ void normal_kernel(T* p, int64_t n, uint64_t seed, float sd, float mean) {
  const int64_t pairs = (n + 1) / 2;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < pairs;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(q)));
    float u1 = static_cast<float>((h >> 40) + 1) * (1.0f / 16777216.0f);  // (0, 1]
    float u2 = static_cast<float>((h >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    float r = sqrtf(-2.0f * logf(u1));
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    put(p, 2 * q, mean + sd * r * c);
    if (2 * q + 1 < n) put(p, 2 * q + 1, mean + sd * r * s);
  }
}

__global__ void uniform_kernel(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
    float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
    p[i] = lo + (hi - lo) * u;
  }
}

template <class T>
__global__ void add_bias_kernel(T* logits, int64_t n, int64_t E, const float* bias) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    put(logits, i, get(logits, i) + bias[i % E]);
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + 255) / 256, 1, 132 * 16));
}

}  // namespace

uint64_t seed_of(const std::string& key, uint64_t global_seed) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return splitmix64(h ^ splitmix64(global_seed));
}

void fill_normal(DTensor& t, uint64_t seed, float sd, float mean, cudaStream_t stream) {
  int64_t n = t.numel();
  if (n == 0) return;
  unsigned g = grid_for((n + 1) / 2);
  switch (t.dtype()) {
    case DType::kF32:
      normal_kernel<<<g, 256, 0, stream>>>(t.ptr<float>(), n, seed, sd, mean);
      break;
    case DType::kF16:
      normal_kernel<<<g, 256, 0, stream>>>(t.ptr<__half>(), n, seed, sd, mean);
      break;
    case DType::kBF16:
      normal_kernel<<<g, 256, 0, stream>>>(t.ptr<__nv_bfloat16>(), n, seed, sd, mean);
      break;
    case DType::kFP8E4M3:
      normal_kernel<<<g, 256, 0, stream>>>(t.ptr<__nv_fp8_e4m3>(), n, seed, sd, mean);
      break;
    default:
      throw std::runtime_error("fill_normal: unsupported dtype");
  }
  BENCH_CUDA(cudaGetLastError());
}

void fill_uniform(DTensor& t, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (t.dtype() != DType::kF32) throw std::runtime_error("fill_uniform: f32 only");
  int64_t n = t.numel();
  if (n == 0) return;
  uniform_kernel<<<grid_for(n), 256, 0, stream>>>(t.ptr<float>(), n, seed, lo, hi);
  BENCH_CUDA(cudaGetLastError());
}

void add_expert_bias(DTensor& logits, const float* bias, cudaStream_t stream) {
  int64_t n = logits.numel(), E = logits.shape().back();
  if (n == 0) return;
  unsigned g = grid_for(n);
  switch (logits.dtype()) {
    case DType::kF32:
      add_bias_kernel<<<g, 256, 0, stream>>>(logits.ptr<float>(), n, E, bias);
      break;
    case DType::kF16:
      add_bias_kernel<<<g, 256, 0, stream>>>(logits.ptr<__half>(), n, E, bias);
      break;
    case DType::kBF16:
      add_bias_kernel<<<g, 256, 0, stream>>>(logits.ptr<__nv_bfloat16>(), n, E, bias);
      break;
    default:
      throw std::runtime_error("add_expert_bias: unsupported dtype");
  }
  BENCH_CUDA(cudaGetLastError());
}

// ---- composition kernels ---------------------------------------------------------------------

namespace {

template <class TI, class TO>
__global__ void silu_mul_kernel(const TI* in, TO* out, int64_t rows, int64_t F) {
  int64_t n = rows * F;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i / F, f = i % F;
    float g = get(in, r * 2 * F + f), u = get(in, r * 2 * F + F + f);
    put(out, i, g / (1.0f + __expf(-g)) * u);
  }
}

template <class T>
__global__ void combine_kernel(const T* y, const float* w, const int32_t* inverse, const T* shared,
                               T* out, int64_t H, int K) {
  const int64_t t = blockIdx.x;
  for (int64_t h = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; h < H;
       h += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float acc = 0.f;
    for (int k = 0; k < K; ++k) {
      int32_t p = inverse[t * K + k];
      if (p >= 0) acc += w[t * K + k] * get(y, static_cast<int64_t>(p) * H + h);
    }
    if (shared) acc += get(shared, t * H + h);
    put(out, t * H + h, acc);
  }
}

}  // namespace

void silu_and_mul_to(const void* in, DType in_dtype, void* out, DType out_dtype, int64_t rows,
                     int64_t F, cudaStream_t stream) {
  if (rows * F == 0) return;
  unsigned g = grid_for(rows * F);
  if (in_dtype == DType::kBF16 && out_dtype == DType::kBF16)
    silu_mul_kernel<<<g, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(in),
                                           static_cast<__nv_bfloat16*>(out), rows, F);
  else if (in_dtype == DType::kF16 && out_dtype == DType::kF16)
    silu_mul_kernel<<<g, 256, 0, stream>>>(static_cast<const __half*>(in),
                                           static_cast<__half*>(out), rows, F);
  else if (in_dtype == DType::kF32 && out_dtype == DType::kF32)
    silu_mul_kernel<<<g, 256, 0, stream>>>(static_cast<const float*>(in), static_cast<float*>(out),
                                           rows, F);
  else
    throw std::runtime_error("silu_and_mul: unsupported dtypes");
  BENCH_CUDA(cudaGetLastError());
}

void silu_and_mul(const void* in, void* out, DType dtype, int64_t rows, int64_t F,
                  cudaStream_t stream) {
  silu_and_mul_to(in, dtype, out, dtype, rows, F, stream);
}

void combine_routes(const void* y, const float* w, const int32_t* inverse, const void* shared,
                    void* out, DType dtype, int64_t T, int K, int64_t H, cudaStream_t stream) {
  if (T == 0 || H == 0) return;
  dim3 grid(static_cast<unsigned>(T),
            static_cast<unsigned>(std::min<int64_t>((H + 255) / 256, 64)));
  if (dtype == DType::kBF16)
    combine_kernel<<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(y), w, inverse,
                                             static_cast<const __nv_bfloat16*>(shared),
                                             static_cast<__nv_bfloat16*>(out), H, K);
  else if (dtype == DType::kF16)
    combine_kernel<<<grid, 256, 0, stream>>>(static_cast<const __half*>(y), w, inverse,
                                             static_cast<const __half*>(shared),
                                             static_cast<__half*>(out), H, K);
  else
    throw std::runtime_error("combine_routes: unsupported dtype");
  BENCH_CUDA(cudaGetLastError());
}

// ---- device + timing -------------------------------------------------------------------------

bool open_device(Device* dev, std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    *why = std::string("no CUDA GPU found (") +
           (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")";
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    *why = "cannot query CUDA device 0";
    return false;
  }
  if (p.major != 9) {
    *why = std::string("moekit needs a Hopper (sm_90) GPU; device 0 is ") + p.name + " (sm_" +
           std::to_string(p.major) + std::to_string(p.minor) + ")";
    return false;
  }
  BENCH_CUDA(cudaSetDevice(0));
  dev->id = 0;
  dev->name = p.name;
  char buf[64];
  const unsigned char* u = reinterpret_cast<const unsigned char*>(p.uuid.bytes);
  std::snprintf(buf, sizeof buf,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  dev->uuid = buf;
  dev->sms = p.multiProcessorCount;
  dev->l2_bytes = p.l2CacheSize;
  dev->total_mem = p.totalGlobalMem;
  return true;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string TimingPlan::describe() const {
  switch (mode) {
    case TimingMode::kGraph:
      return "graph, rotating " + std::to_string(copies) + " input copies";
    case TimingMode::kFlush:
      return "L2 flushed before each call";
    default:
      return "plain (working set > 2x L2)";
  }
}

namespace {

struct Flusher {
  void* buf = nullptr;
  size_t bytes = 0;
  void flush(cudaStream_t s, int salt) {
    if (buf) BENCH_CUDA(cudaMemsetAsync(buf, salt & 0xff, bytes, s));
  }
};

Flusher& flusher(const Device& dev) {
  static Flusher f;
  if (!f.buf) {
    f.bytes = std::max<size_t>(2 * dev.l2_bytes, 64u << 20);
    BENCH_CUDA(cudaMalloc(&f.buf, f.bytes));
  }
  return f;
}

struct Prepared {
  cudaGraphExec_t exec = nullptr;
  int calls = 1;         // calls per replay
  double sample_ms = 0;  // estimated device time of one replay
  bool graph = true;
};

// One timed sample batch of n replays; returns per-call times.
std::vector<double> sample_batch(Impl& impl, Prepared& p, int n, bool flush, const Device& dev,
                                 cudaStream_t s) {
  std::vector<cudaEvent_t> ev(2 * n);
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < n; ++i) {
    if (flush) flusher(dev).flush(s, i);
    BENCH_CUDA(cudaEventRecord(ev[2 * i], s));
    if (p.graph) {
      BENCH_CUDA(cudaGraphLaunch(p.exec, s));
    } else {
      for (int c = 0; c < p.calls; ++c) impl.run(c, s);
    }
    BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], s));
  }
  BENCH_CUDA(cudaStreamSynchronize(s));
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) {
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    out[i] = ms / p.calls;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return out;
}

bool capture(Impl& impl, int calls, int copies, cudaStream_t s, cudaGraphExec_t* exec) {
  cudaGraph_t graph = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  bool ok = true;
  try {
    for (int c = 0; c < calls; ++c) impl.run(c % std::max(copies, 1), s);
  } catch (...) {
    ok = false;
  }
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  if (!ok || e != cudaSuccess || !graph) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    return false;
  }
  e = cudaGraphInstantiate(exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace

namespace {
__global__ void empty_kernel() {}
}  // namespace

double measure_launch_floor(int blocks, int threads, const TimingPlan& plan, const Device& dev,
                            cudaStream_t stream) {
  std::vector<Impl> impls;
  impls.push_back(Impl{"empty", [blocks, threads](int, cudaStream_t s) {
                         empty_kernel<<<blocks, threads, 0, s>>>();
                         BENCH_CUDA(cudaGetLastError());
                       }});
  return time_impls(impls, plan, dev, stream)[0].ms;
}

std::vector<TimingResult> time_impls(std::vector<Impl>& impls, const TimingPlan& plan,
                                     const Device& dev, cudaStream_t s) {
  std::vector<TimingResult> res(impls.size());
  std::vector<Prepared> prep(impls.size());
  const bool flush = plan.mode == TimingMode::kFlush;
  // Warm up, probe one call, and capture each implementation's graph.
  for (size_t i = 0; i < impls.size(); ++i) {
    Impl& im = impls[i];
    if (!im.available || im.skip_timing) continue;
    try {
      im.run(0, s);
      im.run(0, s);
      BENCH_CUDA(cudaStreamSynchronize(s));
      cudaEvent_t a, b;
      BENCH_CUDA(cudaEventCreate(&a));
      BENCH_CUDA(cudaEventCreate(&b));
      if (flush) flusher(dev).flush(s, 0);
      BENCH_CUDA(cudaEventRecord(a, s));
      im.run(0, s);
      BENCH_CUDA(cudaEventRecord(b, s));
      BENCH_CUDA(cudaEventSynchronize(b));
      float probe = 0;
      BENCH_CUDA(cudaEventElapsedTime(&probe, a, b));
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      Prepared& p = prep[i];
      p.calls = 1;
      if (plan.mode == TimingMode::kGraph)
        p.calls = static_cast<int>(std::clamp(0.5 / std::max<double>(probe, 1e-4), 8.0, 2000.0));
      p.graph = capture(im, p.calls, plan.copies, s, &p.exec);
      if (!p.graph) {
        if (!im.note.empty()) im.note += "; ";
        im.note += "not graph-capturable: timed with direct launches";
      }
      p.sample_ms = std::max<double>(probe, 1e-4) * p.calls;
    } catch (const std::exception& e) {
      im.available = false;
      im.note = std::string("failed: ") + e.what();
      cudaError_t sticky = cudaStreamSynchronize(s);
      if (sticky != cudaSuccess)
        throw std::runtime_error(std::string("CUDA context lost while running ") + im.name + ": " +
                                 cudaGetErrorString(sticky));
    }
  }
  for (int r = 0; r < plan.rounds; ++r) {
    for (size_t i = 0; i < impls.size(); ++i) {
      Impl& im = impls[i];
      Prepared& p = prep[i];
      if (!im.available || im.skip_timing) continue;
      int n = static_cast<int>(
          std::clamp(plan.max_ms / p.sample_ms, 3.0, static_cast<double>(plan.max_samples)));
      if (p.sample_ms * plan.min_calls <= plan.max_ms) n = std::max(n, plan.min_calls);
      try {
        std::vector<double> t = sample_batch(im, p, n, flush, dev, s);
        res[i].round_medians.push_back(median(t));
      } catch (const std::exception& e) {
        im.available = false;
        im.note = std::string("failed while timing: ") + e.what();
        cudaError_t sticky = cudaStreamSynchronize(s);
        if (sticky != cudaSuccess)
          throw std::runtime_error(std::string("CUDA context lost while timing ") + im.name + ": " +
                                   cudaGetErrorString(sticky));
      }
    }
  }
  for (size_t i = 0; i < impls.size(); ++i) {
    if (prep[i].exec) cudaGraphExecDestroy(prep[i].exec);
    if (impls[i].available && !impls[i].skip_timing) res[i].ms = median(res[i].round_medians);
    res[i].note = impls[i].note;
  }
  return res;
}

}  // namespace moekit::bench
