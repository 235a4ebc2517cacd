// Cases of the grouped GEMMs: MoEGroupedGemmFwd (contiguous / masked, optional
// silu_and_mul) and MoEGroupedGemmFP8Fwd. Alternatives: cuBLAS per-expert GEMMs
// (cublasGemmEx loop; cublasGemmGroupedBatchedEx; cuBLASLt block-scaled FP8) and the
// plain GPU reference.
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>

#include "case.h"
#include "reference/gpu_reference.h"
#include "weak_ops.h"

namespace moekit::bench {

// The naive f32 reference runs at ~5 TFLOP/s on an H200 (measured): timing it past
// ~0.1 s a call costs more run time than it tells.
bool ref_cuda_too_slow(double flops, std::string* note) {
  const double est_s = flops / 5e12;
  if (est_s <= 0.1) return false;
  char buf[128];
  std::snprintf(buf, sizeof buf, "not timed: the naive f32 reference needs ~%.1f s a call", est_s);
  *note = buf;
  return true;
}

namespace {

// ---- MoEGroupedGemmFwd ----------------------------------------------------------------------

class GroupedGemmCase : public PlannedCase<GemmPlan> {
 public:
  using PlannedCase::PlannedCase;

  void setup(Env& env) override {
    const TensorSpec* a = row_.w.tensor("a");
    const TensorSpec* b = row_.w.tensor("b");
    masked_ = a->shape.size() == 3;
    E_ = b->shape[0];
    Nb_ = b->shape[1];
    Kd_ = b->shape[2];
    swiglu_ = row_.w.param("activation") == "silu_and_mul";
    N_ = swiglu_ ? Nb_ / 2 : Nb_;
    int64_t max_m = masked_ ? a->shape[1] : 0;
    l_ = make_layout(row_, opt_, masked_, E_, masked_ ? 0 : a->shape[0], max_m,
                     masked_ ? masked_total_rows(row_.w) : 0, seed("counts"), &counts, &notes);
    std::vector<int64_t> ashape =
        masked_ ? std::vector<int64_t>{E_, max_m, Kd_} : std::vector<int64_t>{l_.rows_total, Kd_};
    std::vector<int64_t> cshape =
        masked_ ? std::vector<int64_t>{E_, max_m, N_} : std::vector<int64_t>{l_.rows_total, N_};
    fill_normal(tensor("a", dt_, ashape), seed("a"), 1.f, 0.f, env.stream);
    fill_normal(tensor("b", dt_, {E_, Nb_, Kd_}), seed("b"), 1.f / std::sqrt(float(Kd_)), 0.f,
                env.stream);
    tensor("layout_metadata", DType::kI32, {E_}).upload(l_.metadata());
    tensor("c", out_dt_, cshape);
    stats.routed_rows = l_.valid_rows();
    stats.active_experts = l_.active();
    num_experts = E_;
    sync(env.stream);
  }

  GroupedGemmArgs args(int c) {
    GroupedGemmArgs g;
    g.a = find("a").view(c);
    g.b = find("b").view(c);
    g.layout_metadata = find("layout_metadata").view(c);
    g.layout =
        masked_ ? PermutedLayout::masked(l_.max_m) : PermutedLayout::contiguous(l_.alignment);
    g.activation = swiglu_ ? Activation::kSiluAndMul : Activation::kNone;
    g.c = find("c").view(c);
    // The optional workspace: the SM90 kernels' dynamic schedule (GroupedGemmArgs).
    g.workspace = scratch("ws", moekit::grouped_gemm_workspace_size(g)).workspace();
    g.plan = forced_plan();
    return g;
  }

  bool query_plans(GemmPlan* pick, std::vector<GemmPlan>* candidates) override {
    return ask_planner(&moekit::plan_grouped_gemm, &moekit::grouped_gemm_plan_candidates, args(0),
                       pick, candidates);
  }

  bool ours_linked(std::string* why) const override {
    *why = "moekit::moe_grouped_gemm not linked";
    return linked(&moekit::moe_grouped_gemm);
  }
  void run_ours(int c, cudaStream_t s) override { moekit::moe_grouped_gemm(args(c), s); }

  CheckResult check(Env& env) override {
    find("c").fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor out = find("c").download();
    const double flops = 2.0 * l_.valid_rows() * Nb_ * Kd_;
    const bool cpu = linked(&moekit::reference::moe_grouped_gemm) &&
                     cpu_reference_affordable(flops, find("a").bytes() + find("b").bytes());
    int64_t checked = 0;
    std::vector<uint8_t> mask = check_mask(l_, cpu ? l_.rows_total : opt_.check_rows, &checked);
    HostTensor ref(out_dt_, find("c").shape());
    if (cpu) {
      HostTensor a = find("a").download(), b = find("b").download(), m = l_.metadata();
      GroupedGemmArgs g = args(0);
      g.a = a.view();
      g.b = b.view();
      g.layout_metadata = m.view();
      g.c = ref.view();
      moekit::reference::moe_grouped_gemm(g);
    } else {
      DTensor d(out_dt_, find("c").shape()), dm = upload_mask(mask);
      GroupedGemmArgs g = args(0);
      g.c = d.view();
      DBuffer ws(gpu_reference::grouped_gemm_scratch_bytes(g));
      gpu_reference::moe_grouped_gemm(g, ws.workspace(), env.stream, dm.ptr<uint8_t>());
      sync(env.stream);
      ref = d.download();
    }
    return compare_tensors(out, ref, out_dt_, &mask, describe_ref(cpu, checked, l_.valid_rows()));
  }

  std::vector<AltFactory> alternatives() override {
    std::vector<AltFactory> f;
    f.push_back(
        {"cublas", [this](Env& env) {
           Impl im{"cublas", nullptr};
           DBuffer* h = swiglu_ ? &scratch("cublas_h", l_.rows_total * Nb_ * 2) : nullptr;
           im.run = [this, h, &env](int c, cudaStream_t s) {
             if (!swiglu_) {
               grouped_gemm_loop(*env.blas, dt_, out_dt_, find("a").data(c), find("b").data(c),
                                 find("c").data(c), l_.start, l_.count, Nb_, Kd_, s);
             } else {
               grouped_gemm_loop(*env.blas, dt_, dt_, find("a").data(c), find("b").data(c),
                                 h->data(), l_.start, l_.count, Nb_, Kd_, s);
               silu_and_mul_to(h->data(), dt_, find("c").data(c), out_dt_, l_.rows_total, N_, s);
             }
           };
           im.note = masked_ ? "cublasGemmEx per active expert on its valid rows"
                             : "cublasGemmEx per active expert";
           if (swiglu_) im.note += ", then a silu_and_mul kernel";
           return im;
         }});
    if (!swiglu_)
      f.push_back({"cublas-grouped", [this](Env& env) {
                     auto gb = std::make_shared<GroupedBatched>(dt_, out_dt_, l_.start, l_.count,
                                                                Nb_, Kd_);
                     DTensor& a = find("a");
                     for (int c = 0; c < a.copies(); ++c)
                       gb->add_pointers(a.data(c), find("b").data(c), find("c").data(c));
                     Impl im{"cublas-grouped",
                             [gb, &env](int c, cudaStream_t s) { gb->run(*env.blas, c, s); }};
                     im.note = "cublasGemmGroupedBatchedEx, one group per active expert";
                     return im;
                   }});
    f.push_back({"ref-cuda", [this](Env&) {
                   GroupedGemmArgs g = args(0);
                   DBuffer* ws = &scratch("ref_ws", gpu_reference::grouped_gemm_scratch_bytes(g));
                   Impl im{"ref-cuda", [this, ws](int c, cudaStream_t s) {
                             gpu_reference::moe_grouped_gemm(args(c), ws->workspace(), s);
                           }};
                   im.skip_timing = ref_cuda_too_slow(2.0 * l_.valid_rows() * Nb_ * Kd_, &im.note);
                   return im;
                 }});
    return f;
  }

 private:
  bool masked_ = false, swiglu_ = false;
  int64_t E_ = 0, Nb_ = 0, N_ = 0, Kd_ = 0;
  Layout l_;
};

// ---- MoEGroupedGemmFP8Fwd --------------------------------------------------------------------

HostTensor transpose_2d(const HostTensor& in, int64_t rows, int64_t cols, int64_t offset) {
  HostTensor t(DType::kF32, {cols, rows});
  const float* p = in.as<float>() + offset;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t.as<float>()[c * rows + r] = p[r * cols + c];
  return t;
}

// Masked (a [E, max_m, Kd]) or contiguous (a [P, Kd]) rows; params "scales" ("block", the
// default, "per_channel" or "per_tensor", gemm.h Fp8Scales) and "activation"
// ("silu_and_mul": b holds 2N rows). The scale tensors take the mode's shapes (the
// workload's a_scale / b_scale specs are not read).
class GroupedGemmFP8Case : public PlannedCase<GemmPlan> {
 public:
  using PlannedCase::PlannedCase;

  void setup(Env& env) override {
    const TensorSpec* a = row_.w.tensor("a");
    const TensorSpec* b = row_.w.tensor("b");
    masked_ = a->shape.size() == 3;
    silu_ = row_.w.param("activation") == "silu_and_mul";
    const std::string sc = row_.w.param("scales", "block");
    scales_ = sc == "per_channel"  ? Fp8Scales::kPerChannel
              : sc == "per_tensor" ? Fp8Scales::kPerTensor
                                   : Fp8Scales::kBlock;
    E_ = b->shape[0];
    Nb_ = b->shape[1];
    N_ = silu_ ? Nb_ / 2 : Nb_;
    Kd_ = b->shape[2];
    max_m_ = masked_ ? a->shape[1] : 0;
    KB_ = (Kd_ + 127) / 128;
    NB_ = (Nb_ + 127) / 128;
    l_ = make_layout(row_, opt_, masked_, E_, masked_ ? 0 : a->shape[0], max_m_,
                     masked_ ? masked_total_rows(row_.w) : 0, seed("counts"), &counts, &notes);
    const auto rows = [&](std::vector<int64_t> last) {
      std::vector<int64_t> sh =
          masked_ ? std::vector<int64_t>{E_, max_m_} : std::vector<int64_t>{l_.rows_total};
      sh.insert(sh.end(), last.begin(), last.end());
      return sh;
    };
    std::vector<int64_t> as_shape{1}, bs_shape{E_};
    if (scales_ == Fp8Scales::kBlock) {
      as_shape = rows({KB_});
      bs_shape = {E_, NB_, KB_};
    } else if (scales_ == Fp8Scales::kPerChannel) {
      as_shape = rows({});
      bs_shape = {E_, Nb_};
    }
    // Effective operands a*a_scale ~ N(0, 0.5..1.5) and b*b_scale ~ N(0, ~1/Kd): fp8
    // values stay well inside E4M3's range, the scales carry the magnitudes.
    fill_normal(tensor("a", DType::kFP8E4M3, rows({Kd_})), seed("a"), 1.f, 0.f, env.stream);
    fill_uniform(tensor("a_scale", DType::kF32, as_shape), seed("a_scale"), 0.5f, 1.5f, env.stream);
    fill_normal(tensor("b", DType::kFP8E4M3, {E_, Nb_, Kd_}), seed("b"), 1.f, 0.f, env.stream);
    const float s = 1.f / std::sqrt(float(Kd_));
    fill_uniform(tensor("b_scale", DType::kF32, bs_shape), seed("b_scale"), 0.5f * s, 1.5f * s,
                 env.stream);
    tensor("layout_metadata", DType::kI32, {E_}).upload(l_.metadata());
    tensor("c", DType::kBF16, rows({N_}));
    stats.routed_rows = l_.valid_rows();
    stats.active_experts = l_.active();
    num_experts = E_;
    sync(env.stream);
  }

  GroupedGemmFP8Args args(int c) {
    GroupedGemmFP8Args g;
    g.a = find("a").view(c);
    g.a_scale = find("a_scale").view(c);
    g.b = find("b").view(c);
    g.b_scale = find("b_scale").view(c);
    g.layout_metadata = find("layout_metadata").view(c);
    g.layout = masked_ ? PermutedLayout::masked(0) : PermutedLayout::contiguous(l_.alignment);
    g.scales = scales_;
    g.activation = silu_ ? Activation::kSiluAndMul : Activation::kNone;
    g.c = find("c").view(c);
    // The optional workspace: the dynamic schedule (GroupedGemmFP8Args).
    g.workspace = scratch("ws", moekit::grouped_gemm_fp8_workspace_size(g)).workspace();
    g.plan = forced_plan();
    return g;
  }

  bool query_plans(GemmPlan* pick, std::vector<GemmPlan>* candidates) override {
    return ask_planner(&moekit::plan_grouped_gemm_fp8, &moekit::grouped_gemm_fp8_plan_candidates,
                       args(0), pick, candidates);
  }

  bool ours_linked(std::string* why) const override {
    *why = "moekit::moe_grouped_gemm_fp8 not linked";
    return linked(&moekit::moe_grouped_gemm_fp8);
  }
  void run_ours(int c, cudaStream_t s) override { moekit::moe_grouped_gemm_fp8(args(c), s); }

  CheckResult check(Env& env) override {
    find("c").fill_bytes(0xFF);
    run_ours(0, env.stream);
    sync(env.stream);
    HostTensor out = find("c").download();
    const double flops = 2.0 * l_.valid_rows() * Nb_ * Kd_;
    const bool cpu = linked(&moekit::reference::moe_grouped_gemm_fp8) &&
                     cpu_reference_affordable(flops, find("a").bytes() + find("b").bytes());
    int64_t checked = 0;
    mask_ = check_mask(l_, cpu ? l_.rows_total : opt_.check_rows, &checked);
    ref_ = HostTensor(DType::kBF16, find("c").shape());
    if (cpu) {
      HostTensor a = find("a").download(), as = find("a_scale").download(),
                 b = find("b").download(), bs = find("b_scale").download(), m = l_.metadata();
      GroupedGemmFP8Args g = args(0);
      g.a = a.view();
      g.a_scale = as.view();
      g.b = b.view();
      g.b_scale = bs.view();
      g.layout_metadata = m.view();
      g.c = ref_.view();
      moekit::reference::moe_grouped_gemm_fp8(g);
    } else {
      DTensor d(DType::kBF16, find("c").shape()), dm = upload_mask(mask_);
      GroupedGemmFP8Args g = args(0);
      g.c = d.view();
      DBuffer ws(gpu_reference::grouped_gemm_fp8_scratch_bytes(g));
      gpu_reference::moe_grouped_gemm_fp8(g, ws.workspace(), env.stream, dm.ptr<uint8_t>());
      sync(env.stream);
      ref_ = d.download();
    }
    have_ref_ = true;
    ref_desc_ = describe_ref(cpu, checked, l_.valid_rows());
    return compare_tensors(out, ref_, DType::kFP8E4M3, &mask_, ref_desc_);
  }

  std::vector<AltFactory> alternatives() override {
    std::vector<AltFactory> f;
    // cuBLASLt's block-scaled modes: masked rows, block scales, no activation.
    if (masked_ && scales_ == Fp8Scales::kBlock && !silu_) {
      f.push_back({"cublaslt-fp8", [this](Env& env) { return make_lt(env); }});
    }
    f.push_back({"ref-cuda", [this](Env&) {
                   GroupedGemmFP8Args g = args(0);
                   DBuffer* ws =
                       &scratch("ref_ws", gpu_reference::grouped_gemm_fp8_scratch_bytes(g));
                   Impl im{"ref-cuda", [this, ws](int c, cudaStream_t s) {
                             gpu_reference::moe_grouped_gemm_fp8(args(c), ws->workspace(), s);
                           }};
                   im.skip_timing = ref_cuda_too_slow(2.0 * l_.valid_rows() * Nb_ * Kd_, &im.note);
                   return im;
                 }});
    return f;
  }

 private:
  // cuBLASLt with 1x128 / 128x128 block scales, one matmul per active expert. The
  // scale-tensor layouts cuBLASLt expects are not spelled out for these modes, so each
  // candidate (ours as is, or transposed, for either operand) is tried once against the
  // reference and the first that matches is kept.
  Impl make_lt(Env& env) {
    std::map<int64_t, std::shared_ptr<LtFp8Gemm>> plans;
    for (int64_t e = 0; e < E_; ++e)
      if (l_.count[e] > 0 && !plans.count(l_.count[e]))
        plans[l_.count[e]] = std::make_shared<LtFp8Gemm>(*env.blas, l_.count[e], N_, Kd_, true);
    HostTensor as = find("a_scale").download(), bs = find("b_scale").download();
    // Per expert: a-scale candidates (as is / [KB, m_e]) and b-scale ([NB, KB] / [KB, NB]).
    auto at = std::make_shared<std::vector<DTensor>>();
    auto bt = std::make_shared<std::vector<DTensor>>();
    for (int64_t e = 0; e < E_; ++e) {
      int64_t m = std::max<int64_t>(l_.count[e], 1);
      HostTensor ta = transpose_2d(as, m, KB_, e * max_m_ * KB_);
      // Generously padded: a layout cuBLASLt reads with a rounded-up stride stays in bounds.
      at->emplace_back(DType::kF32, std::vector<int64_t>{KB_ + 4, (m + 127) / 128 * 128});
      BENCH_CUDA(cudaMemcpy(at->back().data(), ta.data(), ta.nbytes(), cudaMemcpyHostToDevice));
      HostTensor tb = transpose_2d(bs, NB_, KB_, e * NB_ * KB_);
      bt->emplace_back(DType::kF32, std::vector<int64_t>{KB_ + 4, NB_ + 4});
      BENCH_CUDA(cudaMemcpy(bt->back().data(), tb.data(), tb.nbytes(), cudaMemcpyHostToDevice));
    }
    auto variant = std::make_shared<int>(0);
    auto run = [this, plans, at, bt, variant, &env](int c, cudaStream_t s) {
      for (int64_t e = 0; e < E_; ++e) {
        if (l_.count[e] <= 0) continue;
        const float* a_sc = (*variant & 1) ? (*at)[e].ptr<float>()
                                           : find("a_scale").ptr<float>(c) + e * max_m_ * KB_;
        const float* b_sc =
            (*variant & 2) ? (*bt)[e].ptr<float>() : find("b_scale").ptr<float>(c) + e * NB_ * KB_;
        plans.at(l_.count[e])
            ->run(*env.blas, static_cast<const uint8_t*>(find("a").data(c)) + e * max_m_ * Kd_,
                  static_cast<const uint8_t*>(find("b").data(c)) + e * N_ * Kd_,
                  static_cast<uint8_t*>(find("c").data(c)) + e * max_m_ * N_ * 2, a_sc, b_sc, s);
      }
    };
    Impl im{"cublaslt-fp8", run};
    im.note = "cuBLASLt fp8 per active expert, VEC128 / BLK128x128 scales";
    if (!have_ref_) {
      im.note += " (scale layout unverified: --no-check)";
      return im;
    }
    static const char* names[] = {"as is", "a-scale transposed", "b-scale transposed",
                                  "both transposed"};
    std::string tried;
    for (int v = 0; v < 4; ++v) {
      *variant = v;
      find("c").fill_bytes(0xFF);
      run(0, env.stream);
      sync(env.stream);
      CheckResult r = compare_tensors(find("c").download(), ref_, DType::kFP8E4M3, &mask_, "");
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s%s: rel_l2 %.1e", tried.empty() ? "" : "; ", names[v],
                    r.rel_l2);
      tried += buf;
      if (r.pass) {
        im.note += std::string(" (scale layout: ") + names[v] + ")";
        if (v & 1) im.note += ", transposed a-scale prepared outside the timed call";
        return im;
      }
    }
    im.available = false;
    im.note = "output did not match the reference in any scale layout (" + tried + ")";
    return im;
  }

  bool masked_ = true, silu_ = false;
  Fp8Scales scales_ = Fp8Scales::kBlock;
  int64_t E_ = 0, Nb_ = 0, N_ = 0, Kd_ = 0, max_m_ = 0, KB_ = 0, NB_ = 0;
  Layout l_;
  HostTensor ref_;
  std::vector<uint8_t> mask_;
  bool have_ref_ = false;
  std::string ref_desc_;
};

}  // namespace

std::unique_ptr<Case> make_gemm_case(const Row& row, const Options& opt) {
  if (row.w.op == "MoEGroupedGemmFwd") return std::make_unique<GroupedGemmCase>(row, opt);
  if (row.w.op == "MoEGroupedGemmFP8Fwd") return std::make_unique<GroupedGemmFP8Case>(row, opt);
  return nullptr;
}

}  // namespace moekit::bench
