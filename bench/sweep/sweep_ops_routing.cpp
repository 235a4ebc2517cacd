// The sweep's routing and permutation cases: FusedTopKFwd, MoEPermuteAlignFwd,
// MoEPrePermuteFwd, MoEPostPermuteFwd.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/host_dtype.h"
#include "moekit/permute.h"
#include "moekit/reference.h"
#include "moekit/routing.h"
#include "reference/gpu_reference.h"
#include "sweep_ops.h"
#include "sweep_run.h"

namespace moekit::sweep {
namespace {

std::vector<int32_t> download_i32(Context& ctx, const DevTensor& t) {
  HostTensor h = ctx.to_host(t);
  const int32_t* p = h.as<int32_t>();
  return std::vector<int32_t>(p, p + h.numel());
}

// ---- FusedTopKFwd ---------------------------------------------------------------------------

// Every row: K distinct ids in [0, E), weights finite (all rows, not a sample).
void check_id_rows(Outcome& o, const std::vector<int32_t>& ids, const HostTensor& w,
                   const SweepCase& c) {
  int64_t bad_rows = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    const int32_t* row = ids.data() + t * c.K;
    bool ok = true;
    for (int64_t k = 0; k < c.K; ++k) {
      ok &= row[k] >= 0 && row[k] < c.E && std::isfinite(w.as<float>()[t * c.K + k]);
      ok &= std::find(row, row + k, row[k]) == row + k;
    }
    bad_rows += ok ? 0 : 1;
  }
  if (bad_rows) {
    o.fail("topk: " + std::to_string(bad_rows) + " rows with ids out of range, repeated, or a " +
           "non-finite weight");
  }
}

void run_fused_topk(Context& ctx, const SweepCase& c, Outcome& o) {
  const DevTensor g = ctx.tensor(c.dtype, {c.T, c.E});
  fill_logits(ctx, c, g);
  const DevTensor bias = correction_bias(ctx, c);
  const DevTensor w = ctx.tensor(DType::kF32, {c.T, c.K});
  const DevTensor ids = ctx.tensor(DType::kI32, {c.T, c.K});
  FusedTopKArgs a;
  a.gating_output = g.view();
  a.correction_bias = bias.view();
  a.params = topk_params(c);
  a.topk_weights = w.view();
  a.topk_ids = ids.view();
  run_twice(ctx, {{&w, &ids}, {}, [&](cudaStream_t s) { fused_topk(a, s); }}, o);
  check_id_rows(o, download_i32(ctx, ids), ctx.to_host(w), c);

  // Sampled rows against the CPU f64 reference: ids exactly, weights to 1e-6 relative.
  const std::vector<int64_t> rows =
      sample_range(c.T, std::clamp<int64_t>(65536 / c.E, 16, kCheckRows));
  const int64_t n = static_cast<int64_t>(rows.size());
  const HostTensor hg = gather(ctx, g, rows), hw = gather(ctx, w, rows),
                   hi = gather(ctx, ids, rows);
  const HostTensor hb = c.bias ? ctx.to_host(bias) : HostTensor();
  HostTensor rw(DType::kF32, {n, c.K}), ri(DType::kI32, {n, c.K});
  FusedTopKArgs r = a;
  r.gating_output = hg.view();
  r.correction_bias = c.bias ? hb.view() : TensorView{};
  r.topk_weights = rw.view();
  r.topk_ids = ri.view();
  reference::fused_topk(r);
  o.reference = "cpu-f64, " + std::to_string(n) + " of " + std::to_string(c.T) + " rows";
  int64_t bad_ids = 0, bad_w = 0;
  std::vector<double> logits(static_cast<size_t>(c.E));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* got = hi.as<int32_t>() + i * c.K;
    const int32_t* want = ri.as<int32_t>() + i * c.K;
    if (!std::equal(got, got + c.K, want)) {
      for (int64_t e = 0; e < c.E; ++e) logits[e] = hg.at(i * c.E + e);
      if (topk_row_unambiguous(logits.data(), c.bias ? hb.as<float>() : nullptr, c)) {
        ++bad_ids;
      } else {
        ++o.ambiguous_rows;
      }
      continue;
    }
    for (int64_t k = 0; k < c.K; ++k) {
      const double x = hw.as<float>()[i * c.K + k], y = rw.as<float>()[i * c.K + k];
      bad_w += std::fabs(x - y) > 1e-6 * std::fabs(y) + 1e-12 ? 1 : 0;
    }
  }
  if (bad_ids) o.fail("topk_ids: " + std::to_string(bad_ids) + " rows differ from the reference");
  if (bad_w) o.fail("topk_weights: " + std::to_string(bad_w) + " weights off by more than 1e-6");
}

// ---- MoEPermuteAlignFwd ---------------------------------------------------------------------

void run_permute_align(Context& ctx, const SweepCase& c, Outcome& o) {
  const std::vector<int32_t> ids_h = draw_topk_ids(c);
  const DevTensor ids = ctx.upload(DType::kI32, {c.T, c.K}, ids_h.data());
  const int E = static_cast<int>(c.E);
  const int64_t S = permute_align_sorted_size(c.T * c.K, E, c.block_size);
  const int64_t NB = permute_align_num_blocks(c.T * c.K, E, c.block_size);
  const DevTensor sorted = ctx.tensor(DType::kI32, {S});
  const DevTensor blocks = ctx.tensor(DType::kI32, {NB});
  const DevTensor total = ctx.tensor(DType::kI32, {1});
  PermuteAlignArgs a;
  a.topk_ids = ids.view();
  a.num_experts = E;
  a.block_size = c.block_size;
  a.sorted_token_ids = sorted.view();
  a.expert_ids = blocks.view();
  a.num_tokens_post_padded = total.view();
  a.workspace = ctx.workspace(permute_align_workspace_size(a));
  run_twice(
      ctx,
      {{&sorted, &blocks, &total}, a.workspace, [&](cudaStream_t s) { moe_permute_align(a, s); }},
      o);
  HostTensor hids(DType::kI32, {c.T, c.K}), rs(DType::kI32, {S}), rb(DType::kI32, {NB}),
      rt(DType::kI32, {1});
  if (!ids_h.empty()) std::memcpy(hids.data(), ids_h.data(), ids_h.size() * 4);
  PermuteAlignArgs r = a;
  r.topk_ids = hids.view();
  r.sorted_token_ids = rs.view();
  r.expert_ids = rb.view();
  r.num_tokens_post_padded = rt.view();
  reference::moe_permute_align(r);
  o.reference = "cpu, exact";
  compare_exact(o, "num_tokens_post_padded", download_i32(ctx, total).data(), rt.as<int32_t>(), 1);
  compare_exact(o, "sorted_token_ids", download_i32(ctx, sorted).data(), rs.as<int32_t>(), S);
  compare_exact(o, "expert_ids", download_i32(ctx, blocks).data(), rb.as<int32_t>(), NB);
}

// ---- MoEPrePermuteFwd -----------------------------------------------------------------------

void run_pre_permute(Context& ctx, const SweepCase& c, Outcome& o) {
  const DevTensor x = ctx.tensor(c.dtype, {c.T, c.H});
  fill_normal(x.data, c.dtype, x.numel(), input_seed(c, 0), 1.0f, ctx.stream());
  const std::vector<int32_t> ids_h = draw_topk_ids(c);
  const DevTensor ids = ctx.upload(DType::kI32, {c.T, c.K}, ids_h.data());
  const int E = static_cast<int>(c.E);
  const int64_t P = permuted_rows(c.T, static_cast<int>(c.K), E, c.alignment);
  const DevTensor perm = ctx.tensor(c.dtype, {P, c.H});
  const DevTensor meta = ctx.tensor(DType::kI32, {c.E});
  const DevTensor inv = ctx.tensor(DType::kI32, {c.T * c.K});
  PrePermuteArgs a;
  a.hidden_states = x.view();
  a.local_expert_ids = ids.view();
  a.num_local_experts = E;
  a.layout = PermutedLayout::contiguous(c.alignment);
  a.permuted = perm.view();
  a.layout_metadata = meta.view();
  a.inverse_indices = inv.view();
  a.workspace = ctx.workspace(pre_permute_workspace_size(a));
  run_twice(ctx,
            {{&perm, &meta, &inv}, a.workspace, [&](cudaStream_t s) { moe_pre_permute(a, s); }}, o);

  // The GPU reference gathers rows of 16-bit words: an f32 row of H is one of 2H words.
  const int64_t words = c.H * static_cast<int64_t>(dtype_size(c.dtype)) / 2;
  const DevTensor rperm = ctx.tensor(DType::kBF16, {P, words});
  const DevTensor rmeta = ctx.tensor(DType::kI32, {c.E});
  const DevTensor rinv = ctx.tensor(DType::kI32, {c.T * c.K});
  cuda_ok(cudaMemsetAsync(rperm.data, 0xFF, rperm.bytes(), ctx.stream()), "poison");
  PrePermuteArgs r = a;
  r.hidden_states = make_view(x.data, DType::kBF16, {c.T, words});
  r.permuted = rperm.view();
  r.layout_metadata = rmeta.view();
  r.inverse_indices = rinv.view();
  gpu_reference::moe_pre_permute(r, ctx.stream());
  o.reference = "gpu, exact";
  compare_exact(o, "layout_metadata", download_i32(ctx, meta).data(),
                download_i32(ctx, rmeta).data(), c.E);
  compare_exact(o, "inverse_indices", download_i32(ctx, inv).data(), download_i32(ctx, rinv).data(),
                c.T * c.K);
  unsigned long long* n = ctx.counters();
  diff_bytes(perm.data, rperm.data, perm.bytes(), n, ctx.stream());
  unsigned long long got[4];
  ctx.read_counters(got);
  if (got[0]) {
    o.fail("permuted: " + std::to_string(got[0]) +
           " bytes differ from the reference (rows or untouched padding)");
  }
}

// ---- MoEPostPermuteFwd ----------------------------------------------------------------------

void run_post_permute(Context& ctx, const SweepCase& c, Outcome& o) {
  const int64_t R = c.T * c.K, P = R + c.tail;
  const DevTensor y = ctx.tensor(c.dtype, {P, c.H});
  fill_normal(y.data, c.dtype, y.numel(), input_seed(c, 0), 1.0f, ctx.stream());
  const DevTensor w = ctx.tensor(DType::kF32, {c.T, c.K});
  fill_uniform(static_cast<float*>(w.data), w.numel(), input_seed(c, 1), 0.05f, 1.0f, ctx.stream());
  const std::vector<int32_t> inv_h = draw_inverse(c);
  const DevTensor inv = ctx.upload(DType::kI32, {R}, inv_h.data());
  const DevTensor out = ctx.tensor(c.out, {c.T, c.H});
  PostPermuteArgs a;
  a.expert_output = y.view();
  a.topk_weights = w.view();
  a.inverse_indices = inv.view();
  a.out = out.view();
  run_twice(ctx, {{&out}, {}, [&](cudaStream_t s) { moe_post_permute(a, s); }}, o);
  scan_output(ctx, o, "out", out, nullptr);

  // The CPU f64 reference on sampled tokens, over just the rows they read.
  const std::vector<int64_t> tokens = sample_range(c.T, kCheckRows);
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> rows;
  HostTensor small_inv(DType::kI32, {n * c.K});
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < c.K; ++k) {
      const int32_t r = inv_h[tokens[i] * c.K + k];
      int32_t at = -1;
      if (r >= 0 && r < P) {
        at = static_cast<int32_t>(rows.size());
        rows.push_back(r);
      }
      small_inv.as<int32_t>()[i * c.K + k] = at;
    }
  }
  const HostTensor small_y = gather(ctx, y, rows), small_w = gather(ctx, w, tokens);
  HostTensor ref(c.out, {n, c.H});
  PostPermuteArgs r;
  r.expert_output = make_view(small_y.data(), c.dtype, {static_cast<int64_t>(rows.size()), c.H});
  r.topk_weights = small_w.view();
  r.inverse_indices = small_inv.view();
  r.out = ref.view();
  reference::moe_post_permute(r);
  o.reference = "cpu-f64, " + std::to_string(n) + " of " + std::to_string(c.T) + " rows";
  compare_rows(o, "out", gather(ctx, out, tokens), ref, c.out);
}

}  // namespace

void run_routing_op(Context& ctx, const SweepCase& c, Outcome& o) {
  switch (c.op) {
    case Op::kFusedTopK:
      return run_fused_topk(ctx, c, o);
    case Op::kPermuteAlign:
      return run_permute_align(ctx, c, o);
    case Op::kPrePermute:
      return run_pre_permute(ctx, c, o);
    default:
      return run_post_permute(ctx, c, o);
  }
}

}  // namespace moekit::sweep
