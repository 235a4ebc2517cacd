// The engine-ids translation pass (engine_ids.h): one thread per route, grid-stride.
#include <algorithm>

#include "core/check.h"
#include "permute/engine_ids.h"

namespace moekit::detail {
namespace {

constexpr int kThreads = 256;

template <class Id>
__global__ void __launch_bounds__(kThreads)
    translate_ids_kernel(const Id* __restrict__ ids, int64_t num_routes,
                         const int32_t* __restrict__ map, int64_t map_size, int num_local,
                         int32_t* __restrict__ local) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; r < num_routes;
       r += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t id = static_cast<int64_t>(ids[r]);
    int64_t l = -1;
    if (map != nullptr) {
      if (id >= 0 && id < map_size) l = __ldg(map + id);
    } else {
      l = id;
    }
    local[r] = (l >= 0 && l < num_local) ? static_cast<int32_t>(l) : -1;
  }
}

}  // namespace

void launch_translate_ids(const IdTranslation& t, cudaStream_t stream) {
  if (t.num_routes == 0) return;
  const int64_t blocks = std::min<int64_t>((t.num_routes + kThreads - 1) / kThreads, 4096);
  const dim3 grid(static_cast<unsigned>(blocks));
  if (t.ids_dtype == DType::kI64) {
    translate_ids_kernel<int64_t>
        <<<grid, kThreads, 0, stream>>>(static_cast<const int64_t*>(t.ids), t.num_routes,
                                        t.expert_map, t.map_size, t.num_local, t.local_ids);
  } else {
    translate_ids_kernel<int32_t>
        <<<grid, kThreads, 0, stream>>>(static_cast<const int32_t*>(t.ids), t.num_routes,
                                        t.expert_map, t.map_size, t.num_local, t.local_ids);
  }
  check_launch(t.op);
}

const int32_t* translate_ids_into(const TensorView& ids, const TensorView& expert_map,
                                  int num_local, int32_t* local_ids, cudaStream_t stream) {
  IdTranslation t;
  t.ids = ids.data;
  t.ids_dtype = ids.dtype;
  t.num_routes = ids.numel();
  t.expert_map = expert_map.defined() ? expert_map.ptr<const int32_t>() : nullptr;
  t.map_size = expert_map.defined() ? expert_map.size(0) : 0;
  t.num_local = num_local;
  t.local_ids = local_ids;
  launch_translate_ids(t, stream);
  return t.local_ids;
}

}  // namespace moekit::detail
