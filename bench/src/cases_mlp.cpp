// Cases of the MLP ops: MoEExpertMLPFwd, FusedMoEExpertsFwd, IndexedExpertMLPFwd,
// FusedMoEFwd, FusedMoESharedExpertFwd, SharedExpertMLPFwd. Alternatives: cuBLAS
// compositions (per-expert cublasGemmEx + a silu_and_mul kernel; routing, permutation
// and the weighted combine by plain kernels) and the plain GPU reference.
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>

#include "case.h"
#include "reference/gpu_reference.h"
#include "weak_ops.h"

namespace moekit::bench {
namespace {

// A row's "activation" param, by the Python names (docs/python.md): silu (the default),
// gelu, gelu_tanh, relu2, swigluoai.
Activation row_activation(const Workload& w) {
  const std::string a = w.param("activation");
  if (a.empty() || a == "silu") return Activation::kSiluAndMul;
  if (a == "gelu") return Activation::kGeluAndMul;
  if (a == "gelu_tanh") return Activation::kGeluTanhAndMul;
  if (a == "relu2") return Activation::kRelu2;
  if (a == "swigluoai") return Activation::kSwigluOai;
  throw std::runtime_error("workload " + w.name + ": unknown activation '" + a + "'");
}

// ---- MoEExpertMLPFwd ---------------------------------------------------------------------------

class ExpertMLPCase : public PlannedCase<MlpPlan> {
 public:
  using PlannedCase::PlannedCase;

  void setup(Env& env) override {
    const TensorSpec* x = row_.w.tensor("expert_input");
    H_ = x->shape[1];
    E_ = row_.w.tensor("w_gate_up")->shape[0];
    F_ = row_.w.tensor("w_gate_up")->shape[1] / 2;
    l_ = make_layout(row_, opt_, false, E_, x->shape[0], 0, 0, seed("counts"), &counts, &notes);
    const int64_t P = l_.rows_total;
    fill_normal(tensor("expert_input", dt_, {P, H_}), seed("expert_input"), 1.f, 0.f, env.stream);
    fill_normal(tensor("w_gate_up", dt_, {E_, 2 * F_, H_}), seed("w_gate_up"),
                1.f / std::sqrt(float(H_)), 0.f, env.stream);
    fill_normal(tensor("w_down", dt_, {E_, H_, F_}), seed("w_down"), 1.f / std::sqrt(float(F_)),
                0.f, env.stream);
    tensor("layout_metadata", DType::kI32, {E_}).upload(l_.metadata());
    tensor("expert_output", dt_, {P, H_});
    stats.routed_rows = l_.valid_rows();
    stats.active_experts = l_.active();
    num_experts = E_;
    if (linked(&moekit::expert_mlp_workspace_size))
      ws_ = &scratch("workspace", moekit::expert_mlp_workspace_size(args(0, Workspace{})));
    sync(env.stream);
  }

  ExpertMLPArgs args(int c, Workspace ws) {
    ExpertMLPArgs a;
    a.expert_input = find("expert_input").view(c);
    a.layout_metadata = find("layout_metadata").view(c);
    a.layout = PermutedLayout::contiguous(l_.alignment);
    a.w_gate_up = find("w_gate_up").view(c);
    a.w_down = find("w_down").view(c);
    a.expert_output = find("expert_output").view(c);
    a.workspace = ws;
    a.plan = forced_plan();
    return a;
  }

  bool query_plans(MlpPlan* pick, std::vector<MlpPlan>* candidates) override {
    return ask_planner(&moekit::plan_expert_mlp, &moekit::expert_mlp_plan_candidates,
                       args(0, Workspace{}), pick, candidates);
  }

  bool ours_linked(std::string* why) const override {
    *why = "moekit::moe_expert_mlp not linked";
    return linked(&moekit::moe_expert_mlp) && linked(&moekit::expert_mlp_workspace_size);
  }
  void run_ours(int c, cudaStream_t s) override {
    moekit::moe_expert_mlp(args(c, ws_->workspace()), s);
  }

  CheckResult check(Env& env) override {
    find("expert_output").fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor out = find("expert_output").download();
    const double flops = 6.0 * l_.valid_rows() * F_ * H_;
    const bool cpu = linked(&moekit::reference::moe_expert_mlp) &&
                     cpu_reference_affordable(flops, find("w_gate_up").bytes() * 1.5);
    int64_t checked = 0;
    std::vector<uint8_t> mask = check_mask(l_, cpu ? l_.rows_total : opt_.check_rows, &checked);
    HostTensor ref(dt_, {l_.rows_total, H_});
    if (cpu) {
      HostTensor x = find("expert_input").download(), gu = find("w_gate_up").download(),
                 d = find("w_down").download(), m = l_.metadata();
      ExpertMLPArgs a = args(0, Workspace{});
      a.expert_input = x.view();
      a.w_gate_up = gu.view();
      a.w_down = d.view();
      a.layout_metadata = m.view();
      a.expert_output = ref.view();
      moekit::reference::moe_expert_mlp(a);
    } else {
      DTensor o(dt_, {l_.rows_total, H_}), dm = upload_mask(mask);
      ExpertMLPArgs a = args(0, Workspace{});
      a.expert_output = o.view();
      DBuffer ws(gpu_reference::expert_mlp_scratch_bytes(a));
      a.workspace = ws.workspace();
      gpu_reference::moe_expert_mlp(a, env.stream, dm.ptr<uint8_t>());
      sync(env.stream);
      ref = o.download();
    }
    return compare_tensors(out, ref, dt_, &mask, describe_ref(cpu, checked, l_.valid_rows()));
  }

  std::vector<AltFactory> alternatives() override {
    std::vector<AltFactory> f;
    f.push_back({"cublas-mlp", [this](Env& env) {
                   const int64_t P = l_.rows_total;
                   DBuffer* h = &scratch("h", P * 2 * F_ * 2);
                   DBuffer* act = &scratch("act", P * F_ * 2);
                   Impl im{"cublas-mlp", [this, h, act, &env, P](int c, cudaStream_t s) {
                             grouped_gemm_loop(*env.blas, dt_, dt_, find("expert_input").data(c),
                                               find("w_gate_up").data(c), h->data(), l_.start,
                                               l_.count, 2 * F_, H_, s);
                             silu_and_mul(h->data(), act->data(), dt_, P, F_, s);
                             grouped_gemm_loop(
                                 *env.blas, dt_, dt_, act->data(), find("w_down").data(c),
                                 find("expert_output").data(c), l_.start, l_.count, H_, F_, s);
                           }};
                   im.note = "cublasGemmEx per active expert, silu_and_mul kernel between";
                   return im;
                 }});
    f.push_back({"ref-cuda", [this](Env&) {
                   DBuffer* ws = &scratch(
                       "ref_ws", gpu_reference::expert_mlp_scratch_bytes(args(0, Workspace{})));
                   Impl im{"ref-cuda", [this, ws](int c, cudaStream_t s) {
                             gpu_reference::moe_expert_mlp(args(c, ws->workspace()), s);
                           }};
                   im.skip_timing = ref_cuda_too_slow(6.0 * l_.valid_rows() * F_ * H_, &im.note);
                   return im;
                 }});
    return f;
  }

 private:
  int64_t H_ = 0, E_ = 0, F_ = 0;
  Layout l_;
  DBuffer* ws_ = nullptr;
};

// ---- routed MoE ops: FusedMoEExpertsFwd, IndexedExpertMLPFwd, FusedMoEFwd(+shared) -------------

using moekit::reference::Fp8Activations;

class RoutedCase : public PlannedCase<LayerPlan> {
 public:
  enum class Kind { kExperts, kIndexed, kFused, kFusedShared };
  RoutedCase(const Row& row, const Options& opt, Kind kind) : PlannedCase(row, opt), kind_(kind) {}

  bool fused() const { return kind_ == Kind::kFused || kind_ == Kind::kFusedShared; }
  // A FusedMoESharedExpertFwd row may come without shared-expert weights (the page's
  // qwen3-235b-t512): the op then runs the routed layer alone.
  bool shared() const {
    return kind_ == Kind::kFusedShared && row_.w.tensor("shared_w_gate_up") != nullptr;
  }

  void setup(Env& env) override {
    references_.clear();
    const TensorSpec* x = row_.w.tensor("hidden_states");
    T_ = x->shape[0];
    H_ = x->shape[1];
    E_ = row_.w.tensor("w_gate_up")->shape[0];
    act_ = row_activation(row_.w);
    const int64_t rows = row_.w.tensor("w_gate_up")->shape[1];
    F_ = act_ == Activation::kRelu2 ? rows : rows / 2;
    const std::string wq = row_.w.param("weight_quant", "none");
    if (!parse_quant_scheme(wq, &quant_))
      throw std::runtime_error(
          "weight_quant: none, fp8_per_tensor, fp8_per_channel or "
          "fp8_block128, not '" +
          wq + "'");
    fill_normal(tensor("hidden_states", dt_, {T_, H_}), seed("hidden_states"), 1.f, 0.f,
                env.stream);
    fill_weights("w_gate_up", E_, rows, H_, env);
    fill_weights("w_down", E_, H_, F_, env);
    // Biases ~ N(0, 0.5^2), in the row's dtype unless the tensor names one.
    for (const char* b : {"gate_up_bias", "down_bias"}) {
      const TensorSpec* spec = row_.w.tensor(b);
      if (spec == nullptr) continue;
      const DType bdt = spec->dtype.empty() ? dt_ : parse_dtype(spec->dtype);
      fill_normal(tensor(b, bdt, {E_, std::string(b) == "down_bias" ? H_ : rows}), seed(b), 0.5f,
                  0.f, env.stream);
    }
    if (shared()) {
      S_ = row_.w.tensor("shared_w_gate_up")->shape[0] / 2;
      fill_weights("shared_w_gate_up", 0, 2 * S_, H_, env);
      fill_weights("shared_w_down", 0, H_, S_, env);
    }
    if (fused()) {
      p_.top_k = static_cast<int>(row_.w.int_param("top_k", 8));
      p_.renormalize = row_.w.bool_param("renormalize", false);
      p_.scoring_func =
          row_.w.param("scoring_func") == "sigmoid" ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
      p_.num_expert_group = static_cast<int>(row_.w.int_param("num_expert_group", 0));
      p_.topk_group = static_cast<int>(row_.w.int_param("topk_group", 0));
      p_.routed_scaling_factor = static_cast<float>(row_.w.float_param("routed_scaling_factor", 1));
      K_ = p_.top_k;
      const TensorSpec* g = row_.w.tensor("gating_output");
      DType gdt = g->dtype.empty() ? dt_ : parse_dtype(g->dtype);
      DTensor& logits = tensor("gating_output", gdt, {T_, E_});
      fill_normal(logits, seed("gating_output"), 1.f, 0.f, env.stream);
      if (auto skew = skew_bias(E_, seed_of("skew", opt_.seed), opt_.skew_alpha))
        add_expert_bias(logits, skew->ptr<float>(), env.stream);
      if (row_.w.tensor("correction_bias"))
        fill_normal(tensor("correction_bias", DType::kF32, {E_}), seed("correction_bias"), 0.1f,
                    0.f, env.stream);
      // The reference routing: active experts, and the counts the cuBLAS composition uses.
      ref_ids_ = DTensor(DType::kI32, {T_, K_});
      ref_w_ = DTensor(DType::kF32, {T_, K_});
      FusedTopKArgs tk;
      tk.gating_output = logits.view();
      if (has("correction_bias")) tk.correction_bias = find("correction_bias").view();
      tk.params = p_;
      tk.topk_ids = ref_ids_.view();
      tk.topk_weights = ref_w_.view();
      gpu_reference::fused_topk(tk, env.stream);
    } else {
      K_ = row_.w.tensor("topk_ids")->shape[1];
      route_tokens(tensor("topk_ids", DType::kI32, {T_, K_}),
                   tensor("topk_weights", DType::kF32, {T_, K_}), E_, seed("gating"), opt_,
                   env.stream);
    }
    tensor("output", dt_, {T_, H_});
    sync(env.stream);
    HostTensor ids = fused() ? ref_ids_.download() : find("topk_ids").download();
    stats = routing_stats(ids, E_);
    num_experts = E_;
    counts = "routed";
    // Per-expert route counts (the permuted layout the composition's GEMMs see).
    count_.assign(E_, 0);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      int32_t e = ids.as<int32_t>()[i];
      if (e >= 0 && e < E_) ++count_[e];
    }
    start_.assign(E_, 0);
    for (int64_t e = 1; e < E_; ++e) start_[e] = start_[e - 1] + count_[e - 1];
    size_t ws = workspace_size();
    if (ws != size_t(-1)) ws_ = &scratch("workspace", ws);
  }

  // Weights `name` [E, rows, cols] (E = 0: no E axis) ~ N(0, 1/cols): the row's dtype, or
  // (weight_quant) e4m3 codes ~ N(0, 1) and "<name>_scale" in the scheme's layout, uniform in
  // [0.5, 1.5] / sqrt(cols).
  void fill_weights(const std::string& name, int64_t E, int64_t rows, int64_t cols, Env& env) {
    std::vector<int64_t> shape = {rows, cols};
    if (E > 0) shape.insert(shape.begin(), E);
    const float s = 1.f / std::sqrt(float(cols));
    if (quant_ == QuantScheme::kNone) {
      fill_normal(tensor(name, dt_, shape), seed(name), s, 0.f, env.stream);
      return;
    }
    fill_normal(tensor(name, DType::kFP8E4M3, shape), seed(name), 1.f, 0.f, env.stream);
    const std::vector<int64_t> sshape = weight_scale_shape(quant_, E, rows, cols, E > 0);
    fill_uniform(tensor(name + "_scale", DType::kF32, sshape), seed(name + "_scale"), 0.5f * s,
                 1.5f * s, env.stream);
  }

  // The WeightQuant of weights `prefix` ("w" or "shared_w") on copy c.
  WeightQuant quant(const std::string& prefix, int c) {
    WeightQuant q;
    q.scheme = quant_;
    if (quant_ == QuantScheme::kNone) return q;
    q.w_gate_up_scale = find(prefix + "_gate_up_scale").view(c);
    q.w_down_scale = find(prefix + "_down_scale").view(c);
    return q;
  }

  // The op's own workspace size (-1 when the function is not linked).
  size_t workspace_size() {
    switch (kind_) {
      case Kind::kExperts:
        return linked(&moekit::fused_moe_experts_workspace_size)
                   ? moekit::fused_moe_experts_workspace_size(experts_args(0, {}))
                   : size_t(-1);
      case Kind::kIndexed:
        return linked(&moekit::indexed_expert_mlp_workspace_size)
                   ? moekit::indexed_expert_mlp_workspace_size(experts_args(0, {}))
                   : size_t(-1);
      case Kind::kFused:
        return linked(&moekit::fused_moe_workspace_size)
                   ? moekit::fused_moe_workspace_size(fused_args(0, {}))
                   : size_t(-1);
      case Kind::kFusedShared:
        return linked(&moekit::fused_moe_shared_expert_workspace_size)
                   ? moekit::fused_moe_shared_expert_workspace_size(shared_args(0, {}))
                   : size_t(-1);
    }
    return size_t(-1);
  }

  FusedMoEExpertsArgs experts_args(int c, Workspace ws) {
    FusedMoEExpertsArgs a;
    a.hidden_states = find("hidden_states").view(c);
    a.w_gate_up = find("w_gate_up").view(c);
    a.w_down = find("w_down").view(c);
    a.quant = quant("w", c);
    a.topk_weights = find("topk_weights").view(c);
    a.topk_ids = find("topk_ids").view(c);
    a.output = find("output").view(c);
    set_activation(a, c);
    a.workspace = ws;
    a.plan = forced_plan();
    return a;
  }

  // The row's activation and biases (copy c) into MLP args.
  template <class Args>
  void set_activation(Args& a, int c) {
    a.activation = act_;
    if (has("gate_up_bias")) a.gate_up_bias = find("gate_up_bias").view(c);
    if (has("down_bias")) a.down_bias = find("down_bias").view(c);
  }
  bool plain_silu() const {
    return act_ == Activation::kSiluAndMul && !has("gate_up_bias") && !has("down_bias");
  }

  FusedMoEArgs fused_args(int c, Workspace ws) {
    FusedMoEArgs a;
    a.hidden_states = find("hidden_states").view(c);
    a.gating_output = find("gating_output").view(c);
    if (has("correction_bias")) a.correction_bias = find("correction_bias").view(c);
    a.params = p_;
    a.w_gate_up = find("w_gate_up").view(c);
    a.w_down = find("w_down").view(c);
    a.quant = quant("w", c);
    a.output = find("output").view(c);
    set_activation(a, c);
    a.workspace = ws;
    a.plan = forced_plan();
    return a;
  }

  FusedMoESharedExpertArgs shared_args(int c, Workspace ws) {
    FusedMoESharedExpertArgs a;
    a.moe = fused_args(c, ws);
    if (shared()) {
      a.shared_w_gate_up = find("shared_w_gate_up").view(c);
      a.shared_w_down = find("shared_w_down").view(c);
      a.shared_quant = quant("shared_w", c);
    }
    return a;
  }

  bool query_plans(LayerPlan* pick, std::vector<LayerPlan>* candidates) override {
    switch (kind_) {
      case Kind::kExperts:
        return ask_planner(&moekit::plan_fused_moe_experts,
                           &moekit::fused_moe_experts_plan_candidates, experts_args(0, {}), pick,
                           candidates);
      case Kind::kIndexed:
        return ask_planner(&moekit::plan_indexed_expert_mlp,
                           &moekit::indexed_expert_mlp_plan_candidates, experts_args(0, {}), pick,
                           candidates);
      case Kind::kFused:
        return ask_planner(&moekit::plan_fused_moe, &moekit::fused_moe_plan_candidates,
                           fused_args(0, {}), pick, candidates);
      case Kind::kFusedShared:
        return ask_planner(&moekit::plan_fused_moe_shared_expert,
                           &moekit::fused_moe_shared_expert_plan_candidates, shared_args(0, {}),
                           pick, candidates);
    }
    return false;
  }

  // FP8 rows the library has no path for here (the FP8 GEMMs off an sm_90 device): the
  // planner's own refusal, asked on shapes alone (null data), or "".
  std::string fp8_refusal() const {
    if (!weight_quant_fp8(row_) || kind_ != Kind::kFused || !linked(&moekit::plan_fused_moe))
      return {};
    const auto shape = [&](const char* n) { return row_.w.tensor(n)->shape; };
    const auto view = [](DType dt, const std::vector<int64_t>& sh) {
      return make_view(nullptr, dt, static_cast<int>(sh.size()), sh.data());
    };
    FusedMoEArgs a;
    a.hidden_states = view(dt_, shape("hidden_states"));
    a.gating_output = view(DType::kF32, shape("gating_output"));
    a.w_gate_up = view(DType::kFP8E4M3, shape("w_gate_up"));
    a.w_down = view(DType::kFP8E4M3, shape("w_down"));
    a.output = a.hidden_states;
    a.params.top_k = static_cast<int>(row_.w.int_param("top_k", 8));
    parse_quant_scheme(row_.w.param("weight_quant"), &a.quant.scheme);
    try {
      moekit::plan_fused_moe(a);
    } catch (const moekit::Error& e) {
      const std::string msg = e.what();
      if (msg.find("FP8 weights on a path that runs them") != std::string::npos) return msg;
    }
    return {};
  }

  bool ours_linked(std::string* why) const override {
    const std::string refusal = fp8_refusal();
    if (!refusal.empty()) {
      *why = refusal;
      return false;
    }
    switch (kind_) {
      case Kind::kExperts:
        *why = "moekit::fused_moe_experts not linked";
        return linked(&moekit::fused_moe_experts) &&
               linked(&moekit::fused_moe_experts_workspace_size);
      case Kind::kIndexed:
        *why = "moekit::indexed_expert_mlp not linked";
        return linked(&moekit::indexed_expert_mlp) &&
               linked(&moekit::indexed_expert_mlp_workspace_size);
      case Kind::kFused:
        *why = "moekit::fused_moe not linked";
        return linked(&moekit::fused_moe) && linked(&moekit::fused_moe_workspace_size);
      case Kind::kFusedShared:
        *why = "moekit::fused_moe_shared_expert not linked";
        return linked(&moekit::fused_moe_shared_expert) &&
               linked(&moekit::fused_moe_shared_expert_workspace_size);
    }
    return false;
  }

  void run_ours(int c, cudaStream_t s) override {
    Workspace ws = ws_->workspace();
    switch (kind_) {
      case Kind::kExperts:
        moekit::fused_moe_experts(experts_args(c, ws), s);
        break;
      case Kind::kIndexed:
        moekit::indexed_expert_mlp(experts_args(c, ws), s);
        break;
      case Kind::kFused:
        moekit::fused_moe(fused_args(c, ws), s);
        break;
      case Kind::kFusedShared:
        moekit::fused_moe_shared_expert(shared_args(c, ws), s);
        break;
    }
  }

  // FP8 weights on the FP8 GEMMs (the sorted path; the shared expert past the FP8 direct kernel)
  // quantize the activations: the reference then does too (routed, shared).
  std::pair<Fp8Activations, Fp8Activations> reference_acts() {
    const LayerPlan* p = quant_ == QuantScheme::kNone ? nullptr : run_plan();
    if (p == nullptr) return {Fp8Activations::kAsGiven, Fp8Activations::kAsGiven};
    const auto q = [](bool yes) {
      return yes ? Fp8Activations::kQuantized : Fp8Activations::kAsGiven;
    };
    // The sorted path quantizes its rows on the FP8 GEMMs, not on the weight-only GEMMs
    // (decode_persistent with e4m3 weights: bf16 rows).
    return {
        q(p->routed == RoutedPath::kSorted && p->experts.gate_up.kernel == GemmKernel::kFp8Sm90),
        q(shared() && p->has_shared && p->shared.path == MlpPath::kTwoGemms)};
  }

  // The plain GPU reference of this op on copy c (token mask optional).
  void run_reference(int c, Workspace ws, const TensorView& out, const uint8_t* mask,
                     cudaStream_t s) {
    const auto [acts, shared_acts] = reference_acts();
    switch (kind_) {
      case Kind::kExperts:
      case Kind::kIndexed: {
        FusedMoEExpertsArgs a = experts_args(c, ws);
        a.output = out;
        gpu_reference::fused_moe_experts(a, s, mask, false, acts);
        break;
      }
      case Kind::kFused: {
        FusedMoEArgs a = fused_args(c, ws);
        a.output = out;
        gpu_reference::fused_moe(a, s, mask, false, acts);
        break;
      }
      case Kind::kFusedShared: {
        if (!shared()) {
          FusedMoEArgs a = fused_args(c, ws);
          a.output = out;
          gpu_reference::fused_moe(a, s, mask, false, acts);
          break;
        }
        FusedMoESharedExpertArgs a = shared_args(c, ws);
        a.moe.output = out;
        gpu_reference::fused_moe_shared_expert(a, s, mask, false, acts, shared_acts);
        break;
      }
    }
  }

  size_t reference_scratch() {
    switch (kind_) {
      case Kind::kExperts:
      case Kind::kIndexed:
        return gpu_reference::fused_moe_experts_scratch_bytes(experts_args(0, {}));
      case Kind::kFused:
        return gpu_reference::fused_moe_scratch_bytes(fused_args(0, {}));
      case Kind::kFusedShared:
        return shared() ? gpu_reference::fused_moe_shared_expert_scratch_bytes(shared_args(0, {}))
                        : gpu_reference::fused_moe_scratch_bytes(fused_args(0, {}));
    }
    return 0;
  }

  bool cpu_reference_linked() const {
    switch (kind_) {
      case Kind::kExperts:
        return linked(&moekit::reference::fused_moe_experts);
      case Kind::kIndexed:
        return linked(&moekit::reference::indexed_expert_mlp);
      case Kind::kFused:
        return linked(&moekit::reference::fused_moe);
      case Kind::kFusedShared:
        return linked(&moekit::reference::fused_moe_shared_expert);
    }
    return false;
  }

  double flops() const {
    return 6.0 * stats.routed_rows * F_ * H_ + (shared() ? 6.0 * T_ * S_ * H_ : 0.0);
  }

  CheckResult check(Env& env) override {
    find("output").fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor out = find("output").download();
    const auto [acts, shared_acts] = reference_acts();
    const bool quantizes =
        acts == Fp8Activations::kQuantized || shared_acts == Fp8Activations::kQuantized;
    const Reference& r = reference(env, acts, shared_acts);
    return compare_tensors(out, r.out, quantizes ? DType::kFP8E4M3 : dt_, &r.mask,
                           describe_ref(r.cpu, r.checked, T_));
  }

  // The reference output, the rows it holds and how it was made. It depends on the inputs
  // (set once by setup) and on whether the plan quantizes the activations (reference_acts),
  // not otherwise on the plan: kept per that key, so checking every candidate of a layer
  // (--candidates, moekit-tune) computes it once or twice, not once per candidate.
  struct Reference {
    HostTensor out;
    std::vector<uint8_t> mask;
    bool cpu = false;
    int64_t checked = 0;
  };
  const Reference& reference(Env& env, Fp8Activations acts, Fp8Activations shared_acts) {
    const std::pair<int, int> key{static_cast<int>(acts), static_cast<int>(shared_acts)};
    const auto found = references_.find(key);
    if (found != references_.end()) return found->second;
    Reference r;  // cached once complete (a failed run throws past the cache)
    const double weight_bytes =
        find("w_gate_up").bytes() * 1.5 + (shared() ? find("shared_w_gate_up").bytes() * 1.5 : 0.0);
    // FP8 weights: the GPU reference (it dequantizes them as it reads; the args' scales are
    // device views).
    r.cpu = cpu_reference_linked() && quant_ == QuantScheme::kNone &&
            cpu_reference_affordable(flops(), weight_bytes);
    const bool cpu = r.cpu;
    // Quantized activations (the FP8 GEMM paths) are checked at the fp8 tolerance; a dynamic
    // per-tensor scale spans every row, so the reference runs them all.
    const bool quantizes =
        acts == Fp8Activations::kQuantized || shared_acts == Fp8Activations::kQuantized;
    const bool all_rows = cpu || (quantizes && quant_ == QuantScheme::kFp8PerTensor);
    r.mask = sample_rows(T_, all_rows ? T_ : opt_.check_rows);
    for (uint8_t m : r.mask) r.checked += m;
    HostTensor& ref = r.out;
    ref = HostTensor(dt_, {T_, H_});
    if (cpu) {
      std::vector<HostTensor> keep;
      auto host = [&](const char* n) {
        keep.push_back(find(n).download());
        return keep.back().view();
      };
      keep.reserve(10);
      if (fused()) {
        FusedMoEArgs a = fused_args(0, {});
        a.hidden_states = host("hidden_states");
        a.gating_output = host("gating_output");
        if (has("correction_bias")) a.correction_bias = host("correction_bias");
        a.w_gate_up = host("w_gate_up");
        a.w_down = host("w_down");
        if (has("gate_up_bias")) a.gate_up_bias = host("gate_up_bias");
        if (has("down_bias")) a.down_bias = host("down_bias");
        a.output = ref.view();
        if (shared()) {
          FusedMoESharedExpertArgs sa;
          sa.moe = a;
          sa.shared_w_gate_up = host("shared_w_gate_up");
          sa.shared_w_down = host("shared_w_down");
          moekit::reference::fused_moe_shared_expert(sa);
        } else {
          moekit::reference::fused_moe(a);
        }
      } else {
        FusedMoEExpertsArgs a = experts_args(0, {});
        a.hidden_states = host("hidden_states");
        a.w_gate_up = host("w_gate_up");
        a.w_down = host("w_down");
        a.topk_weights = host("topk_weights");
        a.topk_ids = host("topk_ids");
        if (has("gate_up_bias")) a.gate_up_bias = host("gate_up_bias");
        if (has("down_bias")) a.down_bias = host("down_bias");
        a.output = ref.view();
        if (kind_ == Kind::kIndexed)
          moekit::reference::indexed_expert_mlp(a);
        else
          moekit::reference::fused_moe_experts(a);
      }
    } else {
      DTensor o(dt_, {T_, H_}), dm = upload_mask(r.mask);
      DBuffer ws(reference_scratch());
      run_reference(0, ws.workspace(), o.view(), dm.ptr<uint8_t>(), env.stream);
      sync(env.stream);
      ref = o.download();
    }
    return references_.emplace(key, std::move(r)).first->second;
  }

  std::vector<AltFactory> alternatives() override {
    std::vector<AltFactory> f;
    // The cuBLAS composition multiplies bf16 / f16 weights and runs silu_and_mul without
    // biases: FP8 rows compare with the dequantizing GPU reference (and PyTorch's FP8
    // alternatives, bench/torch_alternatives.py).
    if (quant_ == QuantScheme::kNone) {
      f.push_back({"cublas-mlp", [this](Env& env) {
                     if (plain_silu()) return make_cublas(env);
                     Impl im{"cublas-mlp", nullptr};
                     im.available = false;
                     im.note = "the cuBLAS composition runs silu_and_mul without biases";
                     return im;
                   }});
    }
    f.push_back({"ref-cuda", [this](Env&) {
                   DBuffer* ws = &scratch("ref_ws", reference_scratch());
                   Impl im{"ref-cuda", [this, ws](int c, cudaStream_t s) {
                             run_reference(c, ws->workspace(), find("output").view(c), nullptr, s);
                           }};
                   im.skip_timing = ref_cuda_too_slow(flops(), &im.note);
                   return im;
                 }});
    if (quant_ != QuantScheme::kNone)
      f.push_back({"moekit-bf16-weights", [this](Env& env) { return make_bf16_twin(env); }});
    if (kind_ == Kind::kIndexed && quant_ == QuantScheme::kNone)
      f.push_back({"moekit-fused-experts", [this](Env&) {
                     Impl im{"moekit-fused-experts", nullptr};
                     if (!linked(&moekit::fused_moe_experts)) {
                       im.available = false;
                       im.note = "not linked";
                       return im;
                     }
                     DBuffer* ws = &scratch(
                         "fused_ws", moekit::fused_moe_experts_workspace_size(experts_args(0, {})));
                     im.run = [this, ws](int c, cudaStream_t s) {
                       FusedMoEExpertsArgs a = experts_args(c, ws->workspace());
                       a.plan = nullptr;  // a forced plan is one of IndexedExpertMLPFwd's
                       moekit::fused_moe_experts(a, s);
                     };
                     im.note = "moekit's sorted path (FusedMoEExpertsFwd) on the same inputs";
                     return im;
                   }});
    return f;
  }

 private:
  // FP8 rows: moekit's own op, planned by its planner, with bf16 / f16 weights of the same
  // shapes (drawn as a bf16 row's, in as many rotating copies as the FP8 ones) on the same
  // inputs and routing: what the FP8 weights gain over the same layer in the row's dtype.
  Impl make_bf16_twin(Env& env) {
    Impl im{"moekit-bf16-weights", nullptr};
    const bool ops_linked =
        kind_ == Kind::kExperts ? linked(&moekit::fused_moe_experts) &&
                                      linked(&moekit::fused_moe_experts_workspace_size)
        : kind_ == Kind::kIndexed ? linked(&moekit::indexed_expert_mlp) &&
                                        linked(&moekit::indexed_expert_mlp_workspace_size)
        : kind_ == Kind::kFused
            ? linked(&moekit::fused_moe) && linked(&moekit::fused_moe_workspace_size)
            : linked(&moekit::fused_moe_shared_expert) &&
                  linked(&moekit::fused_moe_shared_expert_workspace_size);
    if (!ops_linked) {
      im.available = false;
      im.note = "not linked";
      return im;
    }
    const int copies = find("w_gate_up").copies();
    const auto twin = [&](const std::string& name) -> const DTensor* {
      if (!has(name)) return nullptr;
      const DTensor& q = find(name);
      auto t = std::make_unique<DTensor>(dt_, q.shape());
      fill_normal(*t, seed(name + "_twin"), 1.f / std::sqrt(float(q.shape().back())), 0.f,
                  env.stream);
      sync(env.stream);  // set_copies copies copy 0 on the default stream
      t->set_copies(copies);
      twins_.push_back(std::move(t));
      return twins_.back().get();
    };
    const DTensor* w13 = twin("w_gate_up");
    const DTensor* w2 = twin("w_down");
    const DTensor* s13 = shared() ? twin("shared_w_gate_up") : nullptr;
    const DTensor* s2 = shared() ? twin("shared_w_down") : nullptr;
    // The op's arguments on copy c with the twins in place of the FP8 weights, the planner's
    // plan (a forced plan is one of the FP8 row's).
    const auto with_twins = [=](auto a, int c) {
      a.w_gate_up = w13->view(c);
      a.w_down = w2->view(c);
      a.quant = WeightQuant{};
      a.plan = nullptr;
      return a;
    };
    const auto shared_args_of = [=](int c, Workspace ws) {
      FusedMoESharedExpertArgs a = shared_args(c, ws);
      a.moe = with_twins(a.moe, c);
      if (s13 != nullptr) {
        a.shared_w_gate_up = s13->view(c);
        a.shared_w_down = s2->view(c);
        a.shared_quant = WeightQuant{};
      }
      return a;
    };
    size_t bytes = 0;
    switch (kind_) {
      case Kind::kExperts:
        bytes = moekit::fused_moe_experts_workspace_size(with_twins(experts_args(0, {}), 0));
        break;
      case Kind::kIndexed:
        bytes = moekit::indexed_expert_mlp_workspace_size(with_twins(experts_args(0, {}), 0));
        break;
      case Kind::kFused:
        bytes = moekit::fused_moe_workspace_size(with_twins(fused_args(0, {}), 0));
        break;
      case Kind::kFusedShared:
        bytes = moekit::fused_moe_shared_expert_workspace_size(shared_args_of(0, {}));
        break;
    }
    DBuffer* ws = &scratch("twin_ws", bytes);
    im.run = [=](int c, cudaStream_t s) {
      switch (kind_) {
        case Kind::kExperts:
          moekit::fused_moe_experts(with_twins(experts_args(c, ws->workspace()), c), s);
          break;
        case Kind::kIndexed:
          moekit::indexed_expert_mlp(with_twins(experts_args(c, ws->workspace()), c), s);
          break;
        case Kind::kFused:
          moekit::fused_moe(with_twins(fused_args(c, ws->workspace()), c), s);
          break;
        case Kind::kFusedShared:
          moekit::fused_moe_shared_expert(shared_args_of(c, ws->workspace()), s);
          break;
      }
    };
    im.note = std::string("moekit with ") + dtype_name(dt_) +
              " weights of the same shapes, same inputs and routing";
    return im;
  }

  QuantScheme quant_ = QuantScheme::kNone;  // the row's weight_quant
  // Routing (fused ops) and permutation by the plain reference kernels, per-expert
  // cublasGemmEx with the counts of the (deterministic) reference routing, a
  // silu_and_mul kernel, the shared expert as two dense cuBLAS GEMMs, and a weighted
  // combine kernel.
  Impl make_cublas(Env& env) {
    const int64_t R = T_ * K_, M = stats.routed_rows;
    DBuffer* xp = &scratch("c_xp", R * H_ * 2);
    DBuffer* meta = &scratch("c_meta", E_ * 4);
    DBuffer* inv = &scratch("c_inv", R * 4);
    DBuffer* h = &scratch("c_h", R * 2 * F_ * 2);
    DBuffer* act = &scratch("c_act", R * F_ * 2);
    DBuffer* y = &scratch("c_y", R * H_ * 2);
    DBuffer* ids = fused() ? &scratch("c_ids", R * 4) : nullptr;
    DBuffer* w = fused() ? &scratch("c_w", R * 4) : nullptr;
    DBuffer* hs = shared() ? &scratch("c_hs", T_ * 2 * S_ * 2) : nullptr;
    DBuffer* as = shared() ? &scratch("c_as", T_ * S_ * 2) : nullptr;
    DBuffer* ys = shared() ? &scratch("c_ys", T_ * H_ * 2) : nullptr;
    Impl im{"cublas-mlp", nullptr};
    im.run = [=, &env](int c, cudaStream_t s) {
      TensorView idv, wv;
      if (fused()) {
        FusedTopKArgs tk;
        tk.gating_output = find("gating_output").view(c);
        if (has("correction_bias")) tk.correction_bias = find("correction_bias").view(c);
        tk.params = p_;
        tk.topk_ids = make_view(ids->data(), DType::kI32, {T_, K_});
        tk.topk_weights = make_view(w->data(), DType::kF32, {T_, K_});
        gpu_reference::fused_topk(tk, s);
        idv = tk.topk_ids;
        wv = tk.topk_weights;
      } else {
        idv = find("topk_ids").view(c);
        wv = find("topk_weights").view(c);
      }
      PrePermuteArgs pp;
      pp.hidden_states = find("hidden_states").view(c);
      pp.local_expert_ids = idv;
      pp.num_local_experts = static_cast<int>(E_);
      pp.layout = PermutedLayout::contiguous(1);
      pp.permuted = make_view(xp->data(), dt_, {R, H_});
      pp.layout_metadata = make_view(meta->data(), DType::kI32, {E_});
      pp.inverse_indices = make_view(inv->data(), DType::kI32, {R});
      gpu_reference::moe_pre_permute(pp, s);
      grouped_gemm_loop(*env.blas, dt_, dt_, xp->data(), find("w_gate_up").data(c), h->data(),
                        start_, count_, 2 * F_, H_, s);
      silu_and_mul(h->data(), act->data(), dt_, M, F_, s);
      grouped_gemm_loop(*env.blas, dt_, dt_, act->data(), find("w_down").data(c), y->data(), start_,
                        count_, H_, F_, s);
      if (shared()) {
        gemm_nt(*env.blas, dt_, dt_, find("hidden_states").data(c),
                find("shared_w_gate_up").data(c), hs->data(), T_, 2 * S_, H_, s);
        silu_and_mul(hs->data(), as->data(), dt_, T_, S_, s);
        gemm_nt(*env.blas, dt_, dt_, as->data(), find("shared_w_down").data(c), ys->data(), T_, H_,
                S_, s);
      }
      combine_routes(y->data(), wv.ptr<float>(), static_cast<const int32_t*>(inv->data()),
                     shared() ? ys->data() : nullptr, find("output").data(c), dt_, T_,
                     static_cast<int>(K_), H_, s);
    };
    im.note = std::string(fused() ? "routing, " : "") +
              "permute and combine by plain kernels, cublasGemmEx per active expert";
    if (shared()) im.note += ", shared expert by dense cuBLAS";
    return im;
  }

  Kind kind_;
  int64_t T_ = 0, H_ = 0, E_ = 0, F_ = 0, K_ = 0, S_ = 0;
  Activation act_ = Activation::kSiluAndMul;
  TopKParams p_;
  DTensor ref_ids_, ref_w_;
  std::vector<int64_t> start_, count_;
  DBuffer* ws_ = nullptr;
  std::map<std::pair<int, int>, Reference> references_;  // reference(): by activation modes
  std::vector<std::unique_ptr<DTensor>> twins_;          // make_bf16_twin's weights
};

// ---- SharedExpertMLPFwd ------------------------------------------------------------------------

class SharedMLPCase : public PlannedCase<MlpPlan> {
 public:
  using PlannedCase::PlannedCase;

  void setup(Env& env) override {
    const TensorSpec* x = row_.w.tensor("hidden_states");
    T_ = x->shape[0];
    H_ = x->shape[1];
    S_ = row_.w.tensor("w_gate_up")->shape[0] / 2;
    fill_normal(tensor("hidden_states", dt_, {T_, H_}), seed("hidden_states"), 1.f, 0.f,
                env.stream);
    fill_normal(tensor("w_gate_up", dt_, {2 * S_, H_}), seed("w_gate_up"),
                1.f / std::sqrt(float(H_)), 0.f, env.stream);
    fill_normal(tensor("w_down", dt_, {H_, S_}), seed("w_down"), 1.f / std::sqrt(float(S_)), 0.f,
                env.stream);
    tensor("output", dt_, {T_, H_});
    if (linked(&moekit::shared_expert_mlp_workspace_size))
      ws_ = &scratch("workspace", moekit::shared_expert_mlp_workspace_size(args(0, {})));
    stats.routed_rows = T_;
    sync(env.stream);
  }

  SharedExpertMLPArgs args(int c, Workspace ws) {
    SharedExpertMLPArgs a;
    a.hidden_states = find("hidden_states").view(c);
    a.w_gate_up = find("w_gate_up").view(c);
    a.w_down = find("w_down").view(c);
    a.output = find("output").view(c);
    a.workspace = ws;
    a.plan = forced_plan();
    return a;
  }

  bool query_plans(MlpPlan* pick, std::vector<MlpPlan>* candidates) override {
    return ask_planner(&moekit::plan_shared_expert_mlp, &moekit::shared_expert_mlp_plan_candidates,
                       args(0, {}), pick, candidates);
  }

  bool ours_linked(std::string* why) const override {
    *why = "moekit::shared_expert_mlp not linked";
    return linked(&moekit::shared_expert_mlp) && linked(&moekit::shared_expert_mlp_workspace_size);
  }
  void run_ours(int c, cudaStream_t s) override {
    moekit::shared_expert_mlp(args(c, ws_->workspace()), s);
  }

  CheckResult check(Env& env) override {
    find("output").fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor out = find("output").download();
    const double flops = 6.0 * T_ * S_ * H_;
    const bool cpu = linked(&moekit::reference::shared_expert_mlp) &&
                     cpu_reference_affordable(flops, find("w_gate_up").bytes() * 1.5);
    std::vector<uint8_t> mask = sample_rows(T_, cpu ? T_ : opt_.check_rows);
    int64_t checked = 0;
    for (uint8_t m : mask) checked += m;
    HostTensor ref(dt_, {T_, H_});
    if (cpu) {
      HostTensor x = find("hidden_states").download(), gu = find("w_gate_up").download(),
                 d = find("w_down").download();
      SharedExpertMLPArgs a = args(0, {});
      a.hidden_states = x.view();
      a.w_gate_up = gu.view();
      a.w_down = d.view();
      a.output = ref.view();
      moekit::reference::shared_expert_mlp(a);
    } else {
      DTensor o(dt_, {T_, H_}), dm = upload_mask(mask);
      SharedExpertMLPArgs a = args(0, {});
      a.output = o.view();
      DBuffer ws(gpu_reference::shared_expert_mlp_scratch_bytes(a));
      a.workspace = ws.workspace();
      gpu_reference::shared_expert_mlp(a, env.stream, dm.ptr<uint8_t>());
      sync(env.stream);
      ref = o.download();
    }
    return compare_tensors(out, ref, dt_, &mask, describe_ref(cpu, checked, T_));
  }

  std::vector<AltFactory> alternatives() override {
    std::vector<AltFactory> f;
    f.push_back({"cublas", [this](Env& env) {
                   DBuffer* h = &scratch("h", T_ * 2 * S_ * 2);
                   DBuffer* act = &scratch("act", T_ * S_ * 2);
                   Impl im{"cublas", [this, h, act, &env](int c, cudaStream_t s) {
                             gemm_nt(*env.blas, dt_, dt_, find("hidden_states").data(c),
                                     find("w_gate_up").data(c), h->data(), T_, 2 * S_, H_, s);
                             silu_and_mul(h->data(), act->data(), dt_, T_, S_, s);
                             gemm_nt(*env.blas, dt_, dt_, act->data(), find("w_down").data(c),
                                     find("output").data(c), T_, H_, S_, s);
                           }};
                   im.note = "two cublasGemmEx and a silu_and_mul kernel";
                   return im;
                 }});
    f.push_back({"ref-cuda", [this](Env&) {
                   DBuffer* ws = &scratch(
                       "ref_ws", gpu_reference::shared_expert_mlp_scratch_bytes(args(0, {})));
                   Impl im{"ref-cuda", [this, ws](int c, cudaStream_t s) {
                             gpu_reference::shared_expert_mlp(args(c, ws->workspace()), s);
                           }};
                   im.skip_timing = ref_cuda_too_slow(6.0 * T_ * S_ * H_, &im.note);
                   return im;
                 }});
    return f;
  }

 private:
  int64_t T_ = 0, H_ = 0, S_ = 0;
  DBuffer* ws_ = nullptr;
};

}  // namespace

std::unique_ptr<Case> make_mlp_case(const Row& row, const Options& opt) {
  const std::string& op = row.w.op;
  using K = RoutedCase::Kind;
  if (op == "MoEExpertMLPFwd") return std::make_unique<ExpertMLPCase>(row, opt);
  if (op == "FusedMoEExpertsFwd") return std::make_unique<RoutedCase>(row, opt, K::kExperts);
  if (op == "IndexedExpertMLPFwd") return std::make_unique<RoutedCase>(row, opt, K::kIndexed);
  if (op == "FusedMoEFwd") return std::make_unique<RoutedCase>(row, opt, K::kFused);
  if (op == "FusedMoESharedExpertFwd")
    return std::make_unique<RoutedCase>(row, opt, K::kFusedShared);
  if (op == "SharedExpertMLPFwd") return std::make_unique<SharedMLPCase>(row, opt);
  return nullptr;
}

}  // namespace moekit::bench
