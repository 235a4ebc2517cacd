// One benchmark row on the device: its inputs, our op, the reference check and the
// registry of named alternatives. Each op has a Case subclass (cases_*.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "blas.h"
#include "cli.h"
#include "device.h"
#include "model.h"
#include "moekit/moekit.h"
#include "reference/accuracy.h"
#include "workload.h"

namespace moekit::bench {

struct Env {
  const Options& opt;
  Device dev;
  cudaStream_t stream = nullptr;
  Blas* blas = nullptr;
};

struct CheckResult {
  bool checked = false, pass = false;
  double rel_l2 = -1, err_ratio = -1;
  std::string reference;  // what the output was compared against
  std::vector<std::string> notes;
};

// A named alternative: `make` builds it (allocating what it needs) once the row is set
// up; a thrown exception makes it "n/a" with the message as its note.
struct AltFactory {
  std::string name;
  std::function<Impl(Env&)> make;
};

class Case {
 public:
  Case(const Row& row, const Options& opt);
  virtual ~Case() = default;

  // Generates the inputs on the device (copy 0) and the routing they need; fills stats.
  virtual void setup(Env& env) = 0;
  // False (with why) when the op is not linked into this build.
  virtual bool ours_linked(std::string* why) const = 0;
  virtual void run_ours(int copy, cudaStream_t s) = 0;
  // Runs ours once on copy 0 (outputs poisoned first) and compares with the reference.
  virtual CheckResult check(Env& env) = 0;
  // The alternative registry of this op.
  virtual std::vector<AltFactory> alternatives() { return {}; }

  // The plan moekit runs for this row, one line (moekit/plan.h to_string): the planner's,
  // or the forced candidate's. "-" when the op has no planner or it is not linked.
  virtual std::string plan() { return "-"; }
  // Every plan this build can run for the row (*_plan_candidates); empty without a planner.
  virtual std::vector<std::string> plan_candidates() { return {}; }
  // Makes run_ours and check run candidate i (args.plan); -1: the planner's plan. Cheap
  // (the timed lambdas call it before every call).
  virtual void force_candidate(int i) {
    if (i >= 0) throw std::out_of_range("this op has no plan candidates");
  }

  RoutingStats stats;
  int64_t num_experts = 0;
  std::string counts;  // "equal", "random", "routed" or ""
  std::vector<std::string> notes;

  size_t working_set_bytes() const;
  void set_copies(int n);

 protected:
  uint64_t seed(const std::string& tensor) const;
  // A device tensor registered for rotation (part of every timed call's working set).
  DTensor& tensor(const std::string& name, DType dtype, std::vector<int64_t> shape);
  DTensor& find(const std::string& name);
  bool has(const std::string& name) const;
  // Scratch that does not rotate (workspaces, reference buffers).
  DBuffer& scratch(const std::string& name, size_t bytes);

  Row row_;
  const Options& opt_;
  DType dt_, out_dt_;

 private:
  std::vector<std::pair<std::string, std::unique_ptr<DTensor>>> tensors_;
  std::vector<std::pair<std::string, std::unique_ptr<DBuffer>>> scratch_;
};

// A case whose op has a planner (Plan: GemmPlan, MlpPlan or LayerPlan). The subclass asks
// the op's plan_* and *_plan_candidates functions (weakly linked) in query_plans; the
// answers are kept from the first question on (they depend on shapes, not on the copy).
// The subclass's args(...) set `plan = forced_plan()`.
template <class Plan>
class PlannedCase : public Case {
 public:
  using Case::Case;

  std::string plan() override {
    load();
    if (forced_ >= 0) return to_string(candidates_[forced_]);
    return planned_ ? to_string(pick_) : "-";
  }
  std::vector<std::string> plan_candidates() override {
    load();
    std::vector<std::string> lines;
    for (const Plan& p : candidates_) lines.push_back(to_string(p));
    return lines;
  }
  void force_candidate(int i) override {
    load();
    if (i >= static_cast<int>(candidates_.size()))
      throw std::out_of_range("no plan candidate " + std::to_string(i) + " (the row has " +
                              std::to_string(candidates_.size()) + ")");
    forced_ = i < 0 ? -1 : i;
  }

 protected:
  // Fills *pick with the planner's plan (true), or returns false when plan_* is not
  // linked; fills *candidates when *_plan_candidates is linked.
  virtual bool query_plans(Plan* pick, std::vector<Plan>* candidates) = 0;
  const Plan* forced_plan() const { return forced_ >= 0 ? &candidates_[forced_] : nullptr; }
  // The plan a run takes: the forced one, else the planner's (nullptr: not linked).
  const Plan* run_plan() {
    load();
    if (forced_ >= 0) return &candidates_[forced_];
    return planned_ ? &pick_ : nullptr;
  }

 private:
  void load() {
    if (loaded_) return;
    planned_ = query_plans(&pick_, &candidates_);
    loaded_ = true;
  }
  bool loaded_ = false, planned_ = false;
  Plan pick_;
  std::vector<Plan> candidates_;
  int forced_ = -1;
};

std::unique_ptr<Case> make_case(const Row& row, const Options& opt);
// Per-family factories (nullptr for ops of other families).
std::unique_ptr<Case> make_routing_case(const Row& row, const Options& opt);
std::unique_ptr<Case> make_gemm_case(const Row& row, const Options& opt);
std::unique_ptr<Case> make_mlp_case(const Row& row, const Options& opt);

// Row ranges of the experts of a permuted buffer, known on the host.
struct Layout {
  bool masked = false;
  int64_t E = 0, max_m = 0, rows_total = 0;
  int alignment = 1;
  std::vector<int64_t> start, count;  // per expert
  int64_t valid_rows() const;
  int64_t active() const;
  HostTensor metadata() const;              // ends (contiguous) or counts (masked)
  std::vector<uint8_t> valid_mask() const;  // one byte per buffer row
};
// Equal (default) or random (--random-counts) per-expert counts: contiguous rows start
// at aligned offsets, masked rows at e*max_m with counts capped at max_m.
Layout make_layout(const Row& row, const Options& opt, bool masked, int64_t E, int64_t rows,
                   int64_t max_m, int64_t total_valid, uint64_t seed, std::string* counts_label,
                   std::vector<std::string>* notes);
// The rows the reference computes: every valid row, or a deterministic sample of
// `max_rows` of them; `checked` gets their number.
std::vector<uint8_t> check_mask(const Layout& l, int64_t max_rows, int64_t* checked);
// A byte mask on the device.
DTensor upload_mask(const std::vector<uint8_t>& m);
// True (with a note) when timing the naive f32 reference would take too long.
bool ref_cuda_too_slow(double flops, std::string* note);

// ---- helpers shared by the cases ------------------------------------------------------------

// Softmax top-k routing of N(0,1) logits over E experts (plus the routing skew),
// through the GPU reference: fills ids [T, K] i32 and weights [T, K] f32.
void route_tokens(DTensor& ids, DTensor& weights, int64_t E, uint64_t seed, const Options& opt,
                  cudaStream_t s);
// The skew bias -alpha*log(1+rank) over a fixed random ranking (null when alpha == 0).
std::unique_ptr<DTensor> skew_bias(int64_t E, uint64_t seed, double alpha);
// Routes (valid ids) and distinct experts in host ids.
RoutingStats routing_stats(const HostTensor& ids, int64_t E);
// Per-expert row counts of P rows: equal (P/E each, the remainder on the first), or
// random (the histogram of softmax top-8 routing of P/8 tokens, scaled to P).
std::vector<int64_t> equal_counts(int64_t P, int64_t E);
std::vector<int64_t> random_counts(int64_t P, int64_t E, uint64_t seed);
// A deterministic sample of `max_rows` of n rows (all when n <= max_rows): evenly
// spaced, first and last included. One byte per row.
std::vector<uint8_t> sample_rows(int64_t n, int64_t max_rows);

// Element-wise comparison of out vs ref (host) over the masked rows, SPEC tolerance of
// `tol_dtype`.
CheckResult compare_tensors(const HostTensor& out, const HostTensor& ref, DType tol_dtype,
                            const std::vector<uint8_t>* row_mask, const std::string& reference);
// Share of differing elements between integer tensors (both fields carry it).
CheckResult compare_exact(const std::vector<int64_t>& out, const std::vector<int64_t>& ref,
                          const std::string& reference);

std::string describe_ref(bool cpu, int64_t rows_checked, int64_t rows_total);

// The layout param: "contiguous(...,alignment=A)" -> A (default 1); "masked(max_m=M)" -> M.
int layout_alignment(const Workload& w);
int64_t layout_max_m(const Workload& w, int64_t fallback);
// Is a CPU f64 reference affordable? (few FLOPs and few input bytes to download)
bool cpu_reference_affordable(double flops, double input_bytes);

}  // namespace moekit::bench
