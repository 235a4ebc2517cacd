#include "core/kernel_launch.h"

#include <iterator>
#include <map>
#include <mutex>
#include <tuple>

#include "moekit/error.h"

namespace moekit::detail {
namespace {

// (device, kernel, kind, threads, cluster, smem) -> a measured count.
using QueryKey = std::tuple<int, const void*, int, int, int, size_t>;

// query() once per key on the current device (each call without a usable device).
template <class Query>
int cached(const void* kernel, int kind, int threads, int cluster, size_t smem, Query query) {
  static std::mutex mutex;
  static std::map<QueryKey, int> values;
  const int device = current_device();
  if (device < 0) return query();
  const QueryKey key{device, kernel, kind, threads, cluster, smem};
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = values.find(key);
  if (it != values.end()) return it->second;
  const int value = query();
  values.emplace(key, value);
  return value;
}

}  // namespace

cudaError_t SmemLimit::raise(const void* kernel, int bytes) {
  const int device = current_device();
  if (device >= 0 && granted_[device].load(std::memory_order_acquire) >= bytes) return cudaSuccess;
  // The check, the driver call and the record under one lock: two threads asking different
  // sizes could otherwise leave the driver at the smaller one while the record says the
  // larger (every later launch past the smaller would then fail). The limit only grows.
  std::lock_guard<std::mutex> lock(mutex_);
  const int granted = device >= 0 ? granted_[device].load(std::memory_order_relaxed) : 0;
  if (granted >= bytes) return cudaSuccess;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return err;
  }
  if (device >= 0) granted_[device].store(bytes, std::memory_order_release);
  return cudaSuccess;
}

int blocks_per_sm(const void* kernel, int threads, size_t smem) {
  return cached(kernel, 0, threads, 1, smem, [&] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess ||
        n < 1) {
      cudaGetLastError();
      n = 1;
    }
    return n;
  });
}

int co_resident_clusters(const void* kernel, int cluster, int threads, size_t smem) {
  return cached(kernel, 1, threads, cluster, smem, [&] {
    LaunchConfig query_config(dim3(static_cast<unsigned>(cluster)),
                              dim3(static_cast<unsigned>(threads)), smem, nullptr);
    const cudaLaunchConfig_t config = query_config.cluster(cluster).config();
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
      cudaGetLastError();
      clusters = 0;
    }
    return clusters;
  });
}

LaunchConfig::LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  config_.gridDim = grid;
  config_.blockDim = block;
  config_.dynamicSmemBytes = smem;
  config_.stream = stream;
}

cudaLaunchAttribute& LaunchConfig::add(cudaLaunchAttributeID id) {
  for (unsigned i = 0; i < num_attrs_; ++i) {
    if (attrs_[i].id == id) throw Error("internal: a launch attribute asked twice");
  }
  if (num_attrs_ == std::size(attrs_)) throw Error("internal: more launch attributes than kept");
  cudaLaunchAttribute& a = attrs_[num_attrs_++];
  a.id = id;
  return a;
}

LaunchConfig& LaunchConfig::cluster(int blocks) {
  cudaLaunchAttribute& a = add(cudaLaunchAttributeClusterDimension);
  a.val.clusterDim.x = static_cast<unsigned>(blocks);
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return *this;
}

LaunchConfig& LaunchConfig::pdl() {
  add(cudaLaunchAttributeProgrammaticStreamSerialization)
      .val.programmaticStreamSerializationAllowed = 1;
  return *this;
}

LaunchConfig& LaunchConfig::cooperative() {
  add(cudaLaunchAttributeCooperative).val.cooperative = 1;
  return *this;
}

cudaLaunchConfig_t LaunchConfig::config() {
  cudaLaunchConfig_t c = config_;
  c.attrs = attrs_;
  c.numAttrs = num_attrs_;
  return c;
}

}  // namespace moekit::detail
