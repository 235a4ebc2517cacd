// The sweep's permuted-buffer cases: MoEGroupedGemmFwd, MoEGroupedGemmFP8Fwd and
// MoEExpertMLPFwd. Rows outside every expert's block hold NaN on input (never read as
// data) and must keep the output's poison.
#include <algorithm>
#include <cmath>

#include "moekit/gemm.h"
#include "moekit/moe.h"
#include "moekit/reference.h"
#include "reference/gpu_reference.h"
#include "sweep_ops.h"
#include "sweep_paths.h"
#include "sweep_run.h"

namespace moekit::sweep {
namespace {

// Sets the rows outside every expert's block of a buffer to NaN (0xFF bytes).
void poison_padding(Context& ctx, const DevTensor& t, const PermutedRows& pr) {
  const size_t row_bytes = static_cast<size_t>(t.row_elems()) * dtype_size(t.dtype);
  poison_rows(t.data, pr.rows, static_cast<int64_t>(row_bytes), device_mask(ctx, pr.valid),
              ctx.stream());
}

// Compares the sampled valid rows of `out` with the reference: the CPU f64 one (`cpu`
// computes it into a host tensor) when the case is small, else the f32 GPU one (`gpu`
// computes the rows of a device mask into a device tensor).
template <class Cpu, class Gpu>
void check_reference(Context& ctx, Outcome& o, const SweepCase& c, const DevTensor& out,
                     const PermutedRows& pr, DType tol, Cpu&& cpu, Gpu&& gpu) {
  const std::vector<int64_t> rows = sample(pr.members, kCheckRows);
  if (cpu_reference_fits(c)) {
    HostMirror m(ctx);
    const HostTensor ref = cpu(m);
    o.reference = "cpu-f64";
    compare_rows(o, "output", gather(ctx, out, rows), gather(ref, rows), tol);
    return;
  }
  const DevTensor ref = ctx.tensor(out.dtype, out.shape);
  cuda_ok(cudaMemsetAsync(ref.data, 0xFF, ref.bytes(), ctx.stream()), "poison");
  gpu(ref, device_mask(ctx, row_mask(pr.rows, rows)));
  o.reference = "gpu-f32, " + std::to_string(rows.size()) + " of " +
                std::to_string(pr.members.size()) + " rows";
  compare_rows(o, "output", gather(ctx, out, rows), gather(ctx, ref, rows), tol);
}

void run_grouped_gemm(Context& ctx, const SweepCase& c, Outcome& o) {
  const PermutedRows pr = permuted_rows_of(c);
  const int64_t b_rows = c.silu ? 2 * c.N : c.N;
  std::vector<int64_t> a_shape = {pr.rows, c.H}, c_shape = {pr.rows, c.N};
  if (c.masked) {
    a_shape = {c.E, c.max_m, c.H};
    c_shape = {c.E, c.max_m, c.N};
  }
  const DevTensor a = ctx.tensor(c.dtype, a_shape);
  fill_normal(a.data, c.dtype, a.numel(), input_seed(c, 0), 1.0f, ctx.stream());
  poison_padding(ctx, a, pr);
  const DevTensor b = weights(ctx, c.dtype, {c.E, b_rows, c.H}, c.H, input_seed(c, 1));
  const DevTensor meta = ctx.upload(DType::kI32, {c.E}, pr.metadata.data());
  const DevTensor out = ctx.tensor(c.out, c_shape);
  GroupedGemmArgs args;
  args.a = a.view();
  args.b = b.view();
  args.layout_metadata = meta.view();
  args.layout =
      c.masked ? PermutedLayout::masked(c.max_m) : PermutedLayout::contiguous(c.alignment);
  args.activation = c.silu ? Activation::kSiluAndMul : Activation::kNone;
  args.c = out.view();
  if (c.workspace) args.workspace = ctx.workspace(grouped_gemm_workspace_size(args));
  GemmPlan plan;
  if (c.knobs.gemm_plan >= 0) {
    args.plan = forced_plan(c.knobs.gemm_plan, grouped_gemm_plan_candidates(args), &plan);
  }
  run_twice(ctx, {{&out}, args.workspace, [&](cudaStream_t s) { moe_grouped_gemm(args, s); }}, o);
  scan_output(ctx, o, "c", out, &pr.valid);
  check_reference(
      ctx, o, c, out, pr, c.out,
      [&](HostMirror& m) {
        GroupedGemmArgs r = args;
        r.a = m.in(args.a);
        r.b = m.in(args.b);
        r.layout_metadata = m.in(args.layout_metadata);
        HostTensor* ref = nullptr;
        r.c = m.out(args.c, &ref);
        reference::moe_grouped_gemm(r);
        return *ref;
      },
      [&](const DevTensor& ref, const uint8_t* mask) {
        GroupedGemmArgs r = args;
        r.c = ref.view();
        const Workspace scratch = ctx.workspace(gpu_reference::grouped_gemm_scratch_bytes(r));
        gpu_reference::moe_grouped_gemm(r, scratch, ctx.stream(), mask);
      });
}

void run_grouped_gemm_fp8(Context& ctx, const SweepCase& c, Outcome& o) {
  const PermutedRows pr = permuted_rows_of(c);
  const int64_t KB = (c.H + 127) / 128, NB = (c.N + 127) / 128;
  const DevTensor a = ctx.tensor(DType::kFP8E4M3, {c.E, c.max_m, c.H});
  fill_normal(a.data, a.dtype, a.numel(), input_seed(c, 0), 1.0f, ctx.stream());
  poison_padding(ctx, a, pr);
  const DevTensor a_scale = ctx.tensor(DType::kF32, {c.E, c.max_m, KB});
  fill_uniform(static_cast<float*>(a_scale.data), a_scale.numel(), input_seed(c, 2), 0.5f, 1.5f,
               ctx.stream());
  poison_padding(ctx, a_scale, pr);
  const DevTensor b = ctx.tensor(DType::kFP8E4M3, {c.E, c.N, c.H});
  fill_normal(b.data, b.dtype, b.numel(), input_seed(c, 1), 1.0f, ctx.stream());
  const DevTensor b_scale = ctx.tensor(DType::kF32, {c.E, NB, KB});
  const float s = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(c.H, 1)));
  fill_uniform(static_cast<float*>(b_scale.data), b_scale.numel(), input_seed(c, 3), 0.5f * s,
               1.5f * s, ctx.stream());
  const DevTensor meta = ctx.upload(DType::kI32, {c.E}, pr.metadata.data());
  const DevTensor out = ctx.tensor(DType::kBF16, {c.E, c.max_m, c.N});
  GroupedGemmFP8Args args;
  args.a = a.view();
  args.a_scale = a_scale.view();
  args.b = b.view();
  args.b_scale = b_scale.view();
  args.layout_metadata = meta.view();
  args.c = out.view();
  GemmPlan plan;
  if (c.knobs.fp8_plan >= 0) {
    args.plan = forced_plan(c.knobs.fp8_plan, grouped_gemm_fp8_plan_candidates(args), &plan);
  }
  run_twice(ctx, {{&out}, {}, [&](cudaStream_t st) { moe_grouped_gemm_fp8(args, st); }}, o);
  scan_output(ctx, o, "c", out, &pr.valid);
  check_reference(
      ctx, o, c, out, pr, DType::kFP8E4M3,
      [&](HostMirror& m) {
        GroupedGemmFP8Args r = args;
        r.a = m.in(args.a);
        r.a_scale = m.in(args.a_scale);
        r.b = m.in(args.b);
        r.b_scale = m.in(args.b_scale);
        r.layout_metadata = m.in(args.layout_metadata);
        HostTensor* ref = nullptr;
        r.c = m.out(args.c, &ref);
        reference::moe_grouped_gemm_fp8(r);
        return *ref;
      },
      [&](const DevTensor& ref, const uint8_t* mask) {
        GroupedGemmFP8Args r = args;
        r.c = ref.view();
        const Workspace scratch = ctx.workspace(gpu_reference::grouped_gemm_fp8_scratch_bytes(r));
        gpu_reference::moe_grouped_gemm_fp8(r, scratch, ctx.stream(), mask);
      });
}

void run_expert_mlp(Context& ctx, const SweepCase& c, Outcome& o) {
  const PermutedRows pr = permuted_rows_of(c);
  const int64_t P = pr.rows;
  const DevTensor x = ctx.tensor(c.dtype, {P, c.H});
  fill_normal(x.data, c.dtype, x.numel(), input_seed(c, 0), 1.0f, ctx.stream());
  poison_padding(ctx, x, pr);
  const DevTensor wgu =
      weights(ctx, c.dtype, {c.E, gate_up_rows(c, c.N), c.H}, c.H, input_seed(c, 1));
  const DevTensor wd = weights(ctx, c.dtype, {c.E, c.H, c.N}, c.N, input_seed(c, 2));
  const MlpBiases bias = mlp_biases(ctx, c, c.E, c.N, c.gate_up_bias, c.down_bias, 12);
  const DevTensor meta = ctx.upload(DType::kI32, {c.E}, pr.metadata.data());
  const DevTensor out = ctx.tensor(c.dtype, {P, c.H});
  ExpertMLPArgs args;
  args.expert_input = x.view();
  args.layout_metadata = meta.view();
  args.layout = PermutedLayout::contiguous(c.alignment);
  args.w_gate_up = wgu.view();
  args.w_down = wd.view();
  args.expert_output = out.view();
  args.activation = c.act;
  args.gate_up_bias = bias.gate_up.view();
  args.down_bias = bias.down.view();
  args.workspace = ctx.workspace(expert_mlp_workspace_size(args));
  MlpPlan plan;
  if (c.knobs.mlp_plan >= 0) {
    args.plan = forced_plan(c.knobs.mlp_plan, expert_mlp_plan_candidates(args), &plan);
  }
  run_twice(ctx, {{&out}, args.workspace, [&](cudaStream_t s) { moe_expert_mlp(args, s); }}, o);
  scan_output(ctx, o, "expert_output", out, &pr.valid);
  check_reference(
      ctx, o, c, out, pr, c.dtype,
      [&](HostMirror& m) {
        ExpertMLPArgs r = args;
        r.expert_input = m.in(args.expert_input);
        r.layout_metadata = m.in(args.layout_metadata);
        r.w_gate_up = m.in(args.w_gate_up);
        r.w_down = m.in(args.w_down);
        r.gate_up_bias = m.in(args.gate_up_bias);
        r.down_bias = m.in(args.down_bias);
        HostTensor* ref = nullptr;
        r.expert_output = m.out(args.expert_output, &ref);
        reference::moe_expert_mlp(r);
        return *ref;
      },
      [&](const DevTensor& ref, const uint8_t* mask) {
        ExpertMLPArgs r = args;
        r.expert_output = ref.view();
        r.workspace = ctx.workspace(gpu_reference::expert_mlp_scratch_bytes(r));
        gpu_reference::moe_expert_mlp(r, ctx.stream(), mask);
      });
}

}  // namespace

void run_gemm_op(Context& ctx, const SweepCase& c, Outcome& o) {
  switch (c.op) {
    case Op::kGroupedGemm:
      return run_grouped_gemm(ctx, c, o);
    case Op::kGroupedGemmFp8:
      return run_grouped_gemm_fp8(ctx, c, o);
    default:
      return run_expert_mlp(ctx, c, o);
  }
}

}  // namespace moekit::sweep
