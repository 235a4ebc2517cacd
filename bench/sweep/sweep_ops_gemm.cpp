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
// `gpu(ref, mask, ulps)`: ulps, the activation amax's bf16 step where `amax_tie`
// (compare_amax_ties).
template <class Cpu, class Gpu>
void check_reference(Context& ctx, Outcome& o, const SweepCase& c, const DevTensor& out,
                     const PermutedRows& pr, DType tol, Cpu&& cpu, Gpu&& gpu,
                     bool amax_tie = false) {
  const std::vector<int64_t> rows = sample(pr.members, kCheckRows);
  if (cpu_reference_fits(c)) {
    HostMirror m(ctx);
    const HostTensor ref = cpu(m);
    o.reference = "cpu-f64";
    compare_rows(o, "output", gather(ctx, out, rows), gather(ref, rows), tol);
    return;
  }
  const DevTensor ref = ctx.tensor(out.dtype, out.shape);
  const uint8_t* mask = device_mask(ctx, row_mask(pr.rows, rows));
  o.reference = "gpu-f32, " + std::to_string(rows.size()) + " of " +
                std::to_string(pr.members.size()) + " rows";
  compare_amax_ties(
      o, amax_tie,
      [&](int ulps) {
        cuda_ok(cudaMemsetAsync(ref.data, 0xFF, ref.bytes(), ctx.stream()), "poison");
        gpu(ref, mask, ulps);
      },
      [&](Outcome& r) {
        compare_rows(r, "output", gather(ctx, out, rows), gather(ctx, ref, rows), tol);
      });
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
      [&](const DevTensor& ref, const uint8_t* mask, int /*ulps*/) {
        GroupedGemmArgs r = args;
        r.c = ref.view();
        const Workspace scratch = ctx.workspace(gpu_reference::grouped_gemm_scratch_bytes(r));
        gpu_reference::moe_grouped_gemm(r, scratch, ctx.stream(), mask);
      });
}

// Sets the scale entries of the rows outside every expert's block to NaN (a per-row scale
// tensor: [E, max_m(, KB)] masked, [P(, KB)] contiguous; one row's entries are contiguous).
void poison_scale_padding(Context& ctx, const DevTensor& t, const PermutedRows& pr) {
  if (pr.rows == 0 || t.numel() == 0) return;
  const int64_t row_bytes = t.numel() / pr.rows * static_cast<int64_t>(dtype_size(t.dtype));
  poison_rows(t.data, pr.rows, row_bytes, device_mask(ctx, pr.valid), ctx.stream());
}

// MoEGroupedGemmFP8Fwd in the case's layout, scale mode (moekit/gemm.h Fp8Scales), activation
// and output: e4m3 codes ~ N(0, 1); a's scales uniform in [0.5, 1.5] (NaN outside the experts'
// rows), b's in [0.5, 1.5] / sqrt(Kd); an e4m3 c's scale maps the outputs (O(1), O(a few)
// with silu_and_mul) into e4m3's range.
void run_grouped_gemm_fp8(Context& ctx, const SweepCase& c, Outcome& o) {
  const PermutedRows pr = permuted_rows_of(c);
  const int64_t KB = (c.H + 127) / 128, b_rows = c.silu ? 2 * c.N : c.N;
  const auto rows_shape = [&](std::vector<int64_t> last) {
    std::vector<int64_t> sh =
        c.masked ? std::vector<int64_t>{c.E, c.max_m} : std::vector<int64_t>{pr.rows};
    sh.insert(sh.end(), last.begin(), last.end());
    return sh;
  };
  const DevTensor a = ctx.tensor(DType::kFP8E4M3, rows_shape({c.H}));
  fill_normal(a.data, a.dtype, a.numel(), input_seed(c, 0), 1.0f, ctx.stream());
  poison_padding(ctx, a, pr);
  std::vector<int64_t> as_shape = {1}, bs_shape = {c.E};
  if (c.fp8_scales == Fp8Scales::kBlock) {
    as_shape = rows_shape({KB});
    bs_shape = {c.E, (b_rows + 127) / 128, KB};
  } else if (c.fp8_scales == Fp8Scales::kPerChannel) {
    as_shape = rows_shape({});
    bs_shape = {c.E, b_rows};
  }
  const DevTensor a_scale = ctx.tensor(DType::kF32, as_shape);
  fill_uniform(static_cast<float*>(a_scale.data), a_scale.numel(), input_seed(c, 2), 0.5f, 1.5f,
               ctx.stream());
  if (c.fp8_scales != Fp8Scales::kPerTensor) poison_scale_padding(ctx, a_scale, pr);
  const DevTensor b = ctx.tensor(DType::kFP8E4M3, {c.E, b_rows, c.H});
  fill_normal(b.data, b.dtype, b.numel(), input_seed(c, 1), 1.0f, ctx.stream());
  const DevTensor b_scale = ctx.tensor(DType::kF32, bs_shape);
  const float s = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(c.H, 1)));
  fill_uniform(static_cast<float*>(b_scale.data), b_scale.numel(), input_seed(c, 3), 0.5f * s,
               1.5f * s, ctx.stream());
  const DevTensor meta = ctx.upload(DType::kI32, {c.E}, pr.metadata.data());
  const DevTensor out = ctx.tensor(c.out, rows_shape({c.N}));
  const float c_scale_h = c.silu ? 1.0f / 16 : 1.0f / 64;
  const DevTensor c_scale =
      c.out == DType::kFP8E4M3 ? ctx.upload(DType::kF32, {1}, &c_scale_h) : DevTensor{};
  GroupedGemmFP8Args args;
  args.a = a.view();
  args.a_scale = a_scale.view();
  args.b = b.view();
  args.b_scale = b_scale.view();
  args.layout_metadata = meta.view();
  args.layout =
      c.masked ? PermutedLayout::masked(c.max_m) : PermutedLayout::contiguous(c.alignment);
  args.scales = c.fp8_scales;
  args.activation = c.silu ? Activation::kSiluAndMul : Activation::kNone;
  args.c = out.view();
  args.c_scale = c_scale.view();
  // The optional workspace (its dynamic schedule), as moe_grouped_gemm's cases.
  if (c.workspace) args.workspace = ctx.workspace(grouped_gemm_fp8_workspace_size(args));
  GemmPlan plan;
  if (c.knobs.fp8_plan >= 0) {
    args.plan = forced_plan(c.knobs.fp8_plan, grouped_gemm_fp8_plan_candidates(args), &plan);
  }
  run_twice(ctx, {{&out}, args.workspace, [&](cudaStream_t st) { moe_grouped_gemm_fp8(args, st); }},
            o);
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
        r.c_scale = m.in(args.c_scale);
        HostTensor* ref = nullptr;
        r.c = m.out(args.c, &ref);
        reference::moe_grouped_gemm_fp8(r);
        return *ref;
      },
      [&](const DevTensor& ref, const uint8_t* mask, int /*ulps*/) {
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
  const MlpWeights w = mlp_weights(ctx, c, c.quant, c.E, c.N, 1);
  const MlpBiases bias = mlp_biases(ctx, c, c.E, c.N, c.gate_up_bias, c.down_bias, 12);
  const DevTensor meta = ctx.upload(DType::kI32, {c.E}, pr.metadata.data());
  const DevTensor out = ctx.tensor(c.dtype, {P, c.H});
  ExpertMLPArgs args;
  args.expert_input = x.view();
  args.layout_metadata = meta.view();
  args.layout = PermutedLayout::contiguous(c.alignment);
  args.w_gate_up = w.gate_up.view();
  args.w_down = w.down.view();
  args.quant = w.quant;
  args.expert_output = out.view();
  args.activation = c.act;
  args.gate_up_bias = bias.gate_up.view();
  args.down_bias = bias.down.view();
  args.workspace = ctx.workspace(expert_mlp_workspace_size(args));
  MlpPlan plan;
  if (c.knobs.mlp_plan >= 0) {
    args.plan = forced_plan(c.knobs.mlp_plan, expert_mlp_plan_candidates(args), &plan);
  }
  // FP8 weights run the FP8 GEMMs, quantizing the activations (path_taken plans bf16 only).
  const reference::Fp8Activations acts = reference_acts(c.quant, true);
  if (c.quant != QuantScheme::kNone && pr.rows > 0)
    o.path = to_string(args.plan ? plan : plan_expert_mlp(args));
  const bool all_rows = reference_needs_all_rows(c, c.quant, acts);
  run_twice(ctx, {{&out}, args.workspace, [&](cudaStream_t s) { moe_expert_mlp(args, s); }}, o);
  scan_output(ctx, o, "expert_output", out, &pr.valid);
  check_reference(
      ctx, o, c, out, pr, c.quant != QuantScheme::kNone ? DType::kFP8E4M3 : c.dtype,
      [&](HostMirror& m) {
        ExpertMLPArgs r = args;
        r.expert_input = m.in(args.expert_input);
        r.layout_metadata = m.in(args.layout_metadata);
        r.w_gate_up = m.in(args.w_gate_up);
        r.w_down = m.in(args.w_down);
        r.quant = mirror_quant(m, args.quant);
        r.gate_up_bias = m.in(args.gate_up_bias);
        r.down_bias = m.in(args.down_bias);
        HostTensor* ref = nullptr;
        r.expert_output = m.out(args.expert_output, &ref);
        reference::moe_expert_mlp(r, acts);
        return *ref;
      },
      [&](const DevTensor& ref, const uint8_t* mask, int ulps) {
        ExpertMLPArgs r = args;
        r.expert_output = ref.view();
        r.workspace = ctx.workspace(gpu_reference::expert_mlp_scratch_bytes(r));
        gpu_reference::moe_expert_mlp(r, ctx.stream(), all_rows ? nullptr : mask, {acts, ulps});
      },
      reference_amax_tie(c, c.quant, acts));
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
