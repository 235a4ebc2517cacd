// ad hoc: direct MLP (gate_up + down) with the down weights prefetched into L2 by gate_up.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>
#include "gemm/direct_mlp_kernel.cuh"
#define CK(x) do{cudaError_t e=(x); if(e){printf("err %s line %d\n",cudaGetErrorString(e),__LINE__); exit(1);} }while(0)
using namespace moekit::detail::gemm;
using bf = __nv_bfloat16;
constexpr int kPad = 32;
struct Plan { int split, slice, groups, smem; };
Plan plan_split(int n, int k, bool silu, int split, int tn, int B) {
  Plan p; p.groups = (n + (silu ? 63 : 127)) / (silu ? 64 : 128);
  int al = B * 32; int slice = ((k + split - 1) / split + al - 1) / al * al;
  p.split = (k + slice - 1) / slice; p.slice = slice; p.smem = tn * (slice + kPad) * 2 + 8 * (tn / 8) * 32 * 16; return p;
}
template <int TN, bool S>
void launch(const Plan& pl, direct::Params p, cudaStream_t st) {
  auto k = direct::direct_gemm_kernel<bf, MmaBF16, bf, TN, S>;
  static bool once = false; if (!once) { CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200*1024)); once = true; }
  cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(pl.split, pl.groups); cfg.blockDim = dim3(256); cfg.dynamicSmemBytes = pl.smem; cfg.stream = st;
  cudaLaunchAttribute a[2]; int n = 0;
  if (pl.split > 1) { a[n].id = cudaLaunchAttributeClusterDimension; a[n].val.clusterDim.x = pl.split; a[n].val.clusterDim.y = 1; a[n].val.clusterDim.z = 1; ++n; }
  if (p.pdl) { a[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[n].val.programmaticStreamSerializationAllowed = 1; ++n; }
  cfg.attrs = a; cfg.numAttrs = n; CK(cudaLaunchKernelEx(&cfg, k, p));
}
template <int TNU, int TND>
void run(const char* name, int T, int H, int S, int su, int sd) {
  cudaStream_t st; CK(cudaStreamCreate(&st));
  size_t wb = (size_t)3 * H * S * 2; int copies = std::min(6, (int)(400e6 / wb) + 1);
  std::vector<bf*> gu(copies), dn(copies);
  for (int i = 0; i < copies; ++i) { CK(cudaMalloc(&gu[i], (size_t)2*S*H*2)); CK(cudaMalloc(&dn[i], (size_t)H*S*2)); CK(cudaMemset(gu[i], 0, (size_t)2*S*H*2)); CK(cudaMemset(dn[i], 0, (size_t)H*S*2)); }
  bf *x, *act, *out; CK(cudaMalloc(&x, (size_t)T*H*2)); CK(cudaMalloc(&act, (size_t)T*S*2)); CK(cudaMalloc(&out, (size_t)T*H*2)); CK(cudaMemset(x, 0, (size_t)T*H*2));
  Plan pu = plan_split(S, H, true, su, TNU, 4), pd = plan_split(H, S, false, sd, TND, 4);
  printf("%-11s up %dx%d down %dx%d |", name, pu.split, pu.groups, pd.split, pd.groups);
  for (int mode : {0, 1, 6, 7}) {  // 0 plain, 1 PDL, 6 up alone, 7 down alone
    const bool pdl = mode & 1 && mode < 6;
    cudaGraph_t g; cudaGraphExec_t ge; const int calls = 60;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < calls; ++i) {
      int c = i % copies;
      direct::Params a{x, gu[c], act, T, H, S, pu.slice, pu.slice + kPad, pdl ? 1 : 0};
      direct::Params b{act, dn[c], out, T, S, H, pd.slice, pd.slice + kPad, pdl ? 2 : 0};
      if (mode != 7) launch<TNU, true>(pu, a, st);
      if (mode != 6) launch<TND, false>(pd, b, st);
    }
    CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1); float best = 1e9;
    for (int r = 0; r < 5; ++r) { cudaEventRecord(e0, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1); best = std::min(best, ms); }
    const char* nm[] = {"plain", "pdl", "", "", "", "", "up", "down"};
    printf(" %s %.2f", nm[mode], best * 1000 / calls);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  }
  printf("\n");
  for (int i = 0; i < copies; ++i) { cudaFree(gu[i]); cudaFree(dn[i]); }
  cudaFree(x); cudaFree(act); cudaFree(out); cudaStreamDestroy(st);
}
int main() {
  cudaFuncAttributes fa;
  cudaFuncGetAttributes(&fa, direct::direct_gemm_kernel<bf, MmaBF16, bf, 8, true>); printf("regs tn8 %d local %zu; ", fa.numRegs, fa.localSizeBytes);
  cudaFuncGetAttributes(&fa, direct::direct_gemm_kernel<bf, MmaBF16, bf, 32, true>); printf("tn32 %d local %zu\n", fa.numRegs, fa.localSizeBytes);
  for (int rep = 0; rep < 2; ++rep) {
    run<32, 32>("ds-v3-t32", 32, 7168, 2048, 7, 4);
    run<32, 32>("glm45-t32", 32, 5120, 1536, 8, 4);
    run<8, 8>("ds-v3-t1", 1, 7168, 2048, 8, 4);
    run<8, 8>("ds-v3-t1", 1, 7168, 2048, 7, 4);
    run<8, 8>("glm45-t1", 1, 5120, 1536, 8, 4);
  }
}
