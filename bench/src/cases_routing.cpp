// Cases of the routing and permutation ops: FusedTopKFwd, MoEPermuteAlignFwd,
// MoEPrePermuteFwd, MoEPostPermuteFwd. Alternatives: the plain GPU reference.
#include <cmath>
#include <stdexcept>

#include "case.h"
#include "reference/gpu_reference.h"
#include "weak_ops.h"

namespace moekit::bench {
namespace {

std::vector<int64_t> as_vec(const HostTensor& h, int64_t n = -1) {
  std::vector<int64_t> v(n < 0 ? h.numel() : std::min<int64_t>(n, h.numel()));
  const int32_t* p = h.as<int32_t>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  return v;
}

// ---- FusedTopKFwd ------------------------------------------------------------------------------

class TopKCase : public Case {
 public:
  using Case::Case;

  void setup(Env& env) override {
    const TensorSpec* g = row_.w.tensor("gating_output");
    T_ = g->shape[0];
    E_ = g->shape[1];
    p_.top_k = static_cast<int>(row_.w.int_param("top_k", 8));
    p_.renormalize = row_.w.bool_param("renormalize", false);
    p_.scoring_func =
        row_.w.param("scoring_func") == "sigmoid" ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
    p_.num_expert_group = static_cast<int>(row_.w.int_param("num_expert_group", 0));
    p_.topk_group = static_cast<int>(row_.w.int_param("topk_group", 0));
    p_.routed_scaling_factor = static_cast<float>(row_.w.float_param("routed_scaling_factor", 1));
    DTensor& logits = tensor("gating_output", dt_, {T_, E_});
    fill_normal(logits, seed("gating_output"), 1.f, 0.f, env.stream);
    if (auto skew = skew_bias(E_, seed_of("skew", opt_.seed), opt_.skew_alpha))
      add_expert_bias(logits, skew->ptr<float>(), env.stream);
    if (row_.w.tensor("correction_bias"))
      fill_normal(tensor("correction_bias", DType::kF32, {E_}), seed("correction_bias"), 0.1f, 0.f,
                  env.stream);
    tensor("topk_weights", DType::kF32, {T_, p_.top_k});
    tensor("topk_ids", DType::kI32, {T_, p_.top_k});
    gpu_reference::fused_topk(args(0), env.stream);
    sync(env.stream);
    stats = routing_stats(find("topk_ids").download(), E_);
    num_experts = E_;
  }

  FusedTopKArgs args(int c) {
    FusedTopKArgs a;
    a.gating_output = find("gating_output").view(c);
    if (has("correction_bias")) a.correction_bias = find("correction_bias").view(c);
    a.params = p_;
    a.topk_weights = find("topk_weights").view(c);
    a.topk_ids = find("topk_ids").view(c);
    return a;
  }

  bool ours_linked(std::string* why) const override {
    *why = "moekit::fused_topk not linked";
    return linked(&moekit::fused_topk);
  }
  void run_ours(int c, cudaStream_t s) override { moekit::fused_topk(args(c), s); }

  CheckResult check(Env& env) override {
    find("topk_weights").fill_bytes(0xFF);
    find("topk_ids").fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor ids = find("topk_ids").download(), w = find("topk_weights").download();
    HostTensor rids(DType::kI32, {T_, p_.top_k}), rw(DType::kF32, {T_, p_.top_k});
    const bool cpu = linked(&moekit::reference::fused_topk);
    if (cpu) {
      HostTensor g = find("gating_output").download();
      HostTensor b = has("correction_bias") ? find("correction_bias").download() : HostTensor();
      FusedTopKArgs a;
      a.gating_output = g.view();
      if (has("correction_bias")) a.correction_bias = b.view();
      a.params = p_;
      a.topk_weights = rw.view();
      a.topk_ids = rids.view();
      moekit::reference::fused_topk(a);
    } else {
      DTensor di(DType::kI32, {T_, p_.top_k}), dw(DType::kF32, {T_, p_.top_k});
      FusedTopKArgs a = args(0);
      a.topk_ids = di.view();
      a.topk_weights = dw.view();
      gpu_reference::fused_topk(a, env.stream);
      sync(env.stream);
      rids = di.download();
      rw = dw.download();
    }
    // ids exactly, weights to 1e-6 relative (SPEC).
    CheckResult r;
    r.checked = true;
    r.reference = cpu ? "cpu-f64" : "gpu-f32";
    int64_t bad_ids = 0, bad_w = 0, bad = 0, n = T_ * p_.top_k;
    double d2 = 0, r2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      double o = w.as<float>()[i], ref = rw.as<float>()[i];
      bool id_bad = ids.as<int32_t>()[i] != rids.as<int32_t>()[i];
      bool w_bad = !std::isfinite(o) || std::fabs(o - ref) > 1e-6 * std::fabs(ref) + 1e-12;
      bad_ids += id_bad;
      bad_w += w_bad;
      bad += id_bad || w_bad;
      d2 += (o - ref) * (o - ref);
      r2 += ref * ref;
    }
    r.rel_l2 = r2 > 0 ? std::sqrt(d2 / r2) : 0;
    r.err_ratio = n ? double(bad) / n : 0;
    r.pass = bad == 0;
    if (bad_ids) r.notes.push_back(std::to_string(bad_ids) + " ids differ from the reference");
    if (bad_w) r.notes.push_back(std::to_string(bad_w) + " weights off by more than 1e-6");
    return r;
  }

  std::vector<AltFactory> alternatives() override {
    return {{"ref-cuda", [this](Env&) {
               return Impl{"ref-cuda", [this](int c, cudaStream_t s) {
                             gpu_reference::fused_topk(args(c), s);
                           }};
             }}};
  }

 private:
  int64_t T_ = 0, E_ = 0;
  TopKParams p_;
};

// ---- MoEPermuteAlignFwd -------------------------------------------------------------------------

class PermuteAlignCase : public Case {
 public:
  using Case::Case;

  void setup(Env& env) override {
    const TensorSpec* t = row_.w.tensor("topk_ids");
    T_ = t->shape[0];
    K_ = t->shape[1];
    E_ = row_.w.int_param("num_experts", 0);
    bs_ = static_cast<int>(row_.w.int_param("block_size", 64));
    DTensor& ids = tensor("topk_ids", DType::kI32, {T_, K_});
    DTensor w(DType::kF32, {T_, K_});
    route_tokens(ids, w, E_, seed("gating"), opt_, env.stream);
    sorted_len_ = T_ * K_ + E_ * (bs_ - 1);
    blocks_ = (sorted_len_ + bs_ - 1) / bs_;
    tensor("sorted_token_ids", DType::kI32, {sorted_len_});
    tensor("expert_ids", DType::kI32, {blocks_});
    tensor("num_tokens_post_padded", DType::kI32, {1});
    stats = routing_stats(ids.download(), E_);
    num_experts = E_;
    counts = "routed";
    if (linked(&moekit::permute_align_workspace_size)) {
      PermuteAlignArgs a = args(0);
      size_t ws = moekit::permute_align_workspace_size(a);
      ws_ = &scratch("workspace", ws);
    }
  }

  PermuteAlignArgs args(int c) {
    PermuteAlignArgs a;
    a.topk_ids = find("topk_ids").view(c);
    a.num_experts = static_cast<int>(E_);
    a.block_size = bs_;
    a.sorted_token_ids = find("sorted_token_ids").view(c);
    a.expert_ids = find("expert_ids").view(c);
    a.num_tokens_post_padded = find("num_tokens_post_padded").view(c);
    if (ws_) a.workspace = ws_->workspace();
    return a;
  }

  bool ours_linked(std::string* why) const override {
    *why = "moekit::moe_permute_align not linked";
    return linked(&moekit::moe_permute_align) && linked(&moekit::permute_align_workspace_size);
  }
  void run_ours(int c, cudaStream_t s) override { moekit::moe_permute_align(args(c), s); }

  CheckResult check(Env& env) override {
    for (const char* n : {"sorted_token_ids", "expert_ids", "num_tokens_post_padded"})
      find(n).fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor s = find("sorted_token_ids").download(), e = find("expert_ids").download(),
               n = find("num_tokens_post_padded").download();
    HostTensor rs(DType::kI32, {sorted_len_}), re(DType::kI32, {blocks_}), rn(DType::kI32, {1});
    const bool cpu = linked(&moekit::reference::moe_permute_align);
    if (cpu) {
      HostTensor ids = find("topk_ids").download();
      PermuteAlignArgs a = args(0);
      a.topk_ids = ids.view();
      a.sorted_token_ids = rs.view();
      a.expert_ids = re.view();
      a.num_tokens_post_padded = rn.view();
      moekit::reference::moe_permute_align(a);
    } else {
      DTensor ds(DType::kI32, {sorted_len_}), de(DType::kI32, {blocks_}), dn(DType::kI32, {1});
      PermuteAlignArgs a = args(0);
      a.sorted_token_ids = ds.view();
      a.expert_ids = de.view();
      a.num_tokens_post_padded = dn.view();
      gpu_reference::moe_permute_align(a, env.stream);
      sync(env.stream);
      rs = ds.download();
      re = de.download();
      rn = dn.download();
    }
    int64_t used = std::clamp<int64_t>(rn.as<int32_t>()[0], 0, sorted_len_);
    std::vector<int64_t> out = as_vec(n), ref = as_vec(rn);
    std::vector<int64_t> a = as_vec(s, used), b = as_vec(rs, used);
    out.insert(out.end(), a.begin(), a.end());
    ref.insert(ref.end(), b.begin(), b.end());
    a = as_vec(e, used / bs_);
    b = as_vec(re, used / bs_);
    out.insert(out.end(), a.begin(), a.end());
    ref.insert(ref.end(), b.begin(), b.end());
    return compare_exact(out, ref, cpu ? "cpu" : "gpu-ref");
  }

  std::vector<AltFactory> alternatives() override {
    return {{"ref-cuda", [this](Env&) {
               return Impl{"ref-cuda", [this](int c, cudaStream_t s) {
                             gpu_reference::moe_permute_align(args(c), s);
                           }};
             }}};
  }

 private:
  int64_t T_ = 0, K_ = 0, E_ = 0, sorted_len_ = 0, blocks_ = 0;
  int bs_ = 64;
  DBuffer* ws_ = nullptr;
};

// ---- MoEPrePermuteFwd ---------------------------------------------------------------------------

class PrePermuteCase : public Case {
 public:
  using Case::Case;

  void setup(Env& env) override {
    const TensorSpec* h = row_.w.tensor("hidden_states");
    T_ = h->shape[0];
    H_ = h->shape[1];
    K_ = row_.w.tensor("local_expert_ids")->shape[1];
    E_ = row_.w.int_param("num_local_experts", 0);
    A_ = layout_alignment(row_.w);
    P_ = permuted_rows(T_, static_cast<int>(K_), static_cast<int>(E_), A_);
    fill_normal(tensor("hidden_states", dt_, {T_, H_}), seed("hidden_states"), 1.f, 0.f,
                env.stream);
    DTensor& ids = tensor("local_expert_ids", DType::kI32, {T_, K_});
    DTensor w(DType::kF32, {T_, K_});
    route_tokens(ids, w, E_, seed("gating"), opt_, env.stream);
    tensor("permuted", dt_, {P_, H_});
    tensor("layout_metadata", DType::kI32, {E_});
    tensor("inverse_indices", DType::kI32, {T_ * K_});
    stats = routing_stats(ids.download(), E_);
    num_experts = E_;
    counts = "routed";
    if (linked(&moekit::pre_permute_workspace_size))
      ws_ = &scratch("workspace", moekit::pre_permute_workspace_size(args(0)));
  }

  PrePermuteArgs args(int c) {
    PrePermuteArgs a;
    a.hidden_states = find("hidden_states").view(c);
    a.local_expert_ids = find("local_expert_ids").view(c);
    a.num_local_experts = static_cast<int>(E_);
    a.layout = PermutedLayout::contiguous(A_);
    a.permuted = find("permuted").view(c);
    a.layout_metadata = find("layout_metadata").view(c);
    a.inverse_indices = find("inverse_indices").view(c);
    if (ws_) a.workspace = ws_->workspace();
    return a;
  }

  bool ours_linked(std::string* why) const override {
    *why = "moekit::moe_pre_permute not linked";
    return linked(&moekit::moe_pre_permute) && linked(&moekit::pre_permute_workspace_size);
  }
  void run_ours(int c, cudaStream_t s) override { moekit::moe_pre_permute(args(c), s); }

  CheckResult check(Env& env) override {
    for (const char* n : {"permuted", "layout_metadata", "inverse_indices"})
      find(n).fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor p = find("permuted").download(), m = find("layout_metadata").download(),
               inv = find("inverse_indices").download();
    HostTensor rp(dt_, {P_, H_}), rm(DType::kI32, {E_}), rinv(DType::kI32, {T_ * K_});
    const bool cpu = linked(&moekit::reference::moe_pre_permute);
    if (cpu) {
      HostTensor x = find("hidden_states").download(), ids = find("local_expert_ids").download();
      PrePermuteArgs a = args(0);
      a.hidden_states = x.view();
      a.local_expert_ids = ids.view();
      a.permuted = rp.view();
      a.layout_metadata = rm.view();
      a.inverse_indices = rinv.view();
      moekit::reference::moe_pre_permute(a);
    } else {
      DTensor dp(dt_, {P_, H_}), dm(DType::kI32, {E_}), di(DType::kI32, {T_ * K_});
      PrePermuteArgs a = args(0);
      a.permuted = dp.view();
      a.layout_metadata = dm.view();
      a.inverse_indices = di.view();
      gpu_reference::moe_pre_permute(a, env.stream);
      sync(env.stream);
      rp = dp.download();
      rm = dm.download();
      rinv = di.download();
    }
    std::vector<int64_t> out = as_vec(m), ref = as_vec(rm);
    std::vector<int64_t> a = as_vec(inv), b = as_vec(rinv);
    out.insert(out.end(), a.begin(), a.end());
    ref.insert(ref.end(), b.begin(), b.end());
    CheckResult meta = compare_exact(out, ref, cpu ? "cpu-f64" : "gpu-f32");
    // The permuted rows that hold routes (by the reference's inverse indices).
    std::vector<uint8_t> mask(P_, 0);
    for (int64_t r = 0; r < T_ * K_; ++r) {
      int32_t q = rinv.as<int32_t>()[r];
      if (q >= 0 && q < P_) mask[q] = 1;
    }
    CheckResult rows = compare_tensors(p, rp, dt_, &mask, meta.reference);
    rows.pass = rows.pass && meta.pass;
    rows.err_ratio = std::max(rows.err_ratio, meta.err_ratio);
    rows.notes.insert(rows.notes.end(), meta.notes.begin(), meta.notes.end());
    return rows;
  }

  std::vector<AltFactory> alternatives() override {
    return {{"ref-cuda", [this](Env&) {
               return Impl{"ref-cuda", [this](int c, cudaStream_t s) {
                             gpu_reference::moe_pre_permute(args(c), s);
                           }};
             }}};
  }

 private:
  int64_t T_ = 0, H_ = 0, K_ = 0, E_ = 0, P_ = 0;
  int A_ = 1;
  DBuffer* ws_ = nullptr;
};

// ---- MoEPostPermuteFwd --------------------------------------------------------------------------

class PostPermuteCase : public Case {
 public:
  using Case::Case;

  void setup(Env& env) override {
    const TensorSpec* x = row_.w.tensor("expert_output");
    P_ = x->shape[0];
    H_ = x->shape[1];
    T_ = row_.w.tensor("topk_weights")->shape[0];
    K_ = row_.w.tensor("topk_weights")->shape[1];
    // Routes come from softmax top-K over num_local_experts (2K when not given), laid
    // out as the reference pre-permute would.
    const int64_t E = std::max(row_.w.int_param("num_local_experts", 2 * K_), K_);
    if (P_ < T_ * K_)
      throw std::runtime_error("expert_output has fewer rows than T*K = " +
                               std::to_string(T_ * K_));
    fill_normal(tensor("expert_output", dt_, {P_, H_}), seed("expert_output"), 1.f, 0.f,
                env.stream);
    DTensor& w = tensor("topk_weights", DType::kF32, {T_, K_});
    DTensor& inv = tensor("inverse_indices", DType::kI32, {T_ * K_});
    DTensor ids(DType::kI32, {T_, K_}), meta(DType::kI32, {E});
    route_tokens(ids, w, E, seed("gating"), opt_, env.stream);
    DTensor none_in(dt_, {T_, 0}), none_out(dt_, {P_, 0});
    PrePermuteArgs pa;
    pa.hidden_states = none_in.view();
    pa.local_expert_ids = ids.view();
    pa.num_local_experts = static_cast<int>(E);
    pa.layout = PermutedLayout::contiguous(1);
    pa.permuted = none_out.view();
    pa.layout_metadata = meta.view();
    pa.inverse_indices = inv.view();
    gpu_reference::moe_pre_permute(pa, env.stream);
    sync(env.stream);
    tensor("out", out_dt_, {T_, H_});
    RoutingStats st = routing_stats(ids.download(), E);
    stats.routed_rows = st.routed_rows;
    counts = "routed";
  }

  PostPermuteArgs args(int c) {
    PostPermuteArgs a;
    a.expert_output = find("expert_output").view(c);
    a.topk_weights = find("topk_weights").view(c);
    a.inverse_indices = find("inverse_indices").view(c);
    a.out = find("out").view(c);
    return a;
  }

  bool ours_linked(std::string* why) const override {
    *why = "moekit::moe_post_permute not linked";
    return linked(&moekit::moe_post_permute);
  }
  void run_ours(int c, cudaStream_t s) override { moekit::moe_post_permute(args(c), s); }

  CheckResult check(Env& env) override {
    find("out").fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor out = find("out").download(), ref(out_dt_, {T_, H_});
    const bool cpu = linked(&moekit::reference::moe_post_permute);
    if (cpu) {
      HostTensor x = find("expert_output").download(), w = find("topk_weights").download(),
                 inv = find("inverse_indices").download();
      PostPermuteArgs a;
      a.expert_output = x.view();
      a.topk_weights = w.view();
      a.inverse_indices = inv.view();
      a.out = ref.view();
      moekit::reference::moe_post_permute(a);
    } else {
      DTensor d(out_dt_, {T_, H_});
      PostPermuteArgs a = args(0);
      a.out = d.view();
      gpu_reference::moe_post_permute(a, env.stream);
      sync(env.stream);
      ref = d.download();
    }
    return compare_tensors(out, ref, out_dt_, nullptr, cpu ? "cpu-f64" : "gpu-f32");
  }

  std::vector<AltFactory> alternatives() override {
    return {{"ref-cuda", [this](Env&) {
               return Impl{"ref-cuda", [this](int c, cudaStream_t s) {
                             gpu_reference::moe_post_permute(args(c), s);
                           }};
             }}};
  }

 private:
  int64_t P_ = 0, H_ = 0, T_ = 0, K_ = 0;
};

}  // namespace

std::unique_ptr<Case> make_routing_case(const Row& row, const Options& opt) {
  const std::string& op = row.w.op;
  if (op == "FusedTopKFwd") return std::make_unique<TopKCase>(row, opt);
  if (op == "MoEPermuteAlignFwd") return std::make_unique<PermuteAlignCase>(row, opt);
  if (op == "MoEPrePermuteFwd") return std::make_unique<PrePermuteCase>(row, opt);
  if (op == "MoEPostPermuteFwd") return std::make_unique<PostPermuteCase>(row, opt);
  return nullptr;
}

}  // namespace moekit::bench
