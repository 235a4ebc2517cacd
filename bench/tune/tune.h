// moekit-tune's host-side core (docs/tuning.md "moekit-tune"): the command line, the token
// counts, the skew's alpha search, the partial-results (resume) file, and the step from
// measured times to a table (winners per count, buckets, the guardrail). No CUDA: the CPU
// tests cover all of it; tune_main.cpp measures on the GPU with the bench's harness.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moekit/plan.h"
#include "moekit/tuning.h"
#include "tune_partial.h"
#include "workload.h"

namespace moekit::tune {

struct TuneOptions {
  std::string model = "model";  // a name for the progress lines and the partial file
  std::string dtype = "bf16";
  QuantScheme quant = QuantScheme::kNone;  // the weights' (routed and shared alike)
  int64_t E = 0, H = 0, F = 0, S = 0;
  int top_k = 8;
  std::string scoring = "softmax";  // softmax / sigmoid
  int groups = 0, topk_group = 0;   // grouped routing (0 = none)
  double routed_scaling_factor = 1;
  bool correction_bias = false;  // a per-expert bias as DeepSeek-V3's (sigmoid) routing has
  int64_t experts_lo = -1;       // a local expert range [lo, hi] of the model's E experts
  int64_t experts_hi = -1;       // (expert parallelism): the layer holds hi - lo + 1
  std::vector<int64_t> tokens;   // default: default_token_counts()
  std::string out = "tuned.table";
  std::string partial;  // default: out + ".partial"
  bool dry_run = false;
  // --verify-builtin / --verify FILE: check every plan the built-in tables (or FILE) name
  // for this device, at the ends of each served range, against the reference; no tuning.
  bool verify_builtin = false;
  std::string verify_file;
  bool skewed = true;  // also measure skewed routing
  int rounds = 3;
  double max_ms = 200;
  // Screening (successive halving): every candidate timed once, briefly (one round of
  // screen_ms), then only the default and the `finalists` fastest accurate ones with the
  // full method (rounds x max_ms). 0: every candidate with the full method.
  int finalists = 4;
  double screen_ms = 20;
  uint64_t seed = 1;
  bool help = false;

  int64_t local_experts() const { return experts_lo >= 0 ? experts_hi - experts_lo + 1 : E; }
  std::string experts_field() const;  // "all" or "lo-hi"
  std::string op() const { return S > 0 ? "fused_moe_shared_expert" : "fused_moe"; }
  TuningShape shape() const;
  std::string partial_path() const { return partial.empty() ? out + ".partial" : partial; }
};

// Throws std::invalid_argument naming the bad option.
TuneOptions parse_tune_options(const std::vector<std::string>& args);
std::string tune_usage();

// 1-16, then the CUDA-graph buckets 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048,
// 4096, 8192, 16384.
std::vector<int64_t> default_token_counts();

// The bench's skew (--skew ALPHA: a per-expert logit bias -ALPHA*log(1+rank)) whose busiest
// expert gets `target` times the mean load: softmax top-k routing of `tokens` tokens of
// N(0,1) logits over E experts, on the CPU (deterministic in seed), bisected on alpha.
double expert_load_ratio(int64_t E, int top_k, double alpha, int64_t tokens, uint64_t seed);
double skew_alpha_for(int64_t E, int top_k, double target = 2.0, int64_t tokens = 8192,
                      uint64_t seed = 1);

bool verifying(const TuneOptions& o);

// The layer an entry of a table names (op, dtype, E, H, F, top_k, routing, S), as options
// whose layer_row / layer_candidates build it; throws std::invalid_argument on a routing
// name routing_name() does not write.
TuneOptions options_for_entry(const TuningEntry& e);
// The counts at which a table's entry is verified: each served range's ends, ascending.
std::vector<int64_t> verify_counts(const TuningEntry& e);

// The bench row of the layer at T tokens (FusedMoEFwd or FusedMoESharedExpertFwd).
bench::Row layer_row(const TuneOptions& o, int64_t T);

// The layer's plan candidates at T (the public *_plan_candidates of its op, on the current
// device: without a GPU, those of arch 0) and, given planned, the library's plan.
std::vector<LayerPlan> layer_candidates(const TuneOptions& o, int64_t T, LayerPlan* planned);

// After a step's screening (one measurement per candidate, in candidate order): which
// candidates the full method times. The default, the accurate plans named in `keep` (the
// finalists of the count's other routing, so both routings time them), and the `n` fastest
// accurate others (ties by candidate order); inaccurate or failed ones never. n <= 0: all.
std::vector<bool> pick_finalists(const std::vector<Measurement>& screened, int n,
                                 const std::set<std::string>& keep);

// The partial-results file: a header naming the run, then one line per measurement; a run
// resumes from the (count, routing) pairs it holds. Throws std::runtime_error (file:line)
// on a line that does not parse, or a header of another run. A line: tune_partial.h.
std::string partial_header(const TuneOptions& o);
std::vector<Measurement> read_partial(const std::string& text, const std::string& header,
                                      const std::string& name);

// From the measurements to table entries: per count the fastest accurate plan (by its mean
// ratio to the default over the routings), consecutive counts with one winner grouped, each
// group kept where the guardrail accepts it under every routing (else each count alone).
// `log` gets one line per decision.
std::vector<TuningEntry> build_entries(const TuneOptions& o, const std::string& device,
                                       const std::vector<Measurement>& ms,
                                       std::vector<std::string>* log);

}  // namespace moekit::tune
