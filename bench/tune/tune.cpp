// moekit-tune's host-side core (tune.h).
#include "tune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

#include "moe/tuning_table.h"
#include "moekit/moe.h"

namespace moekit::tune {
namespace {

int64_t integer(const std::string& flag, const std::string& v, int64_t lo) {
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || n < lo)
    throw std::invalid_argument(flag + ": expected an integer >= " + std::to_string(lo) +
                                ", got '" + v + "'");
  return n;
}

double number(const std::string& flag, const std::string& v) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !(x > 0))
    throw std::invalid_argument(flag + ": expected a number > 0, got '" + v + "'");
  return x;
}

// "1-16,24,32" -> 1..16, 24, 32.
std::vector<int64_t> counts(const std::string& flag, const std::string& v) {
  std::vector<int64_t> out;
  std::stringstream in(v);
  std::string part;
  while (std::getline(in, part, ',')) {
    const size_t dash = part.find('-');
    const int64_t lo = integer(flag, part.substr(0, dash), 1);
    const int64_t hi = dash == std::string::npos ? lo : integer(flag, part.substr(dash + 1), lo);
    for (int64_t T = lo; T <= hi; ++T) out.push_back(T);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) throw std::invalid_argument(flag + ": expected token counts, e.g. 1-16,24,32");
  return out;
}

}  // namespace

std::string TuneOptions::experts_field() const {
  return experts_lo < 0 ? "all" : std::to_string(experts_lo) + "-" + std::to_string(experts_hi);
}

TuningShape TuneOptions::shape() const {
  TuningShape s;
  s.op = op();
  s.dtype = dtype;
  s.quant = quant;
  s.E = local_experts();
  s.H = H;
  s.F = F;
  s.top_k = top_k;
  TopKParams p;
  p.scoring_func = scoring == "sigmoid" ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  p.num_expert_group = groups;
  p.topk_group = topk_group;
  s.routing = routing_name(p);
  s.S = S;
  return s;
}

std::string tune_usage() {
  return R"(moekit-tune: measures every plan candidate of a MoE layer at each token count and
writes a tuning table (docs/tuning.md).

  --model NAME            a name for progress lines (default "model")
  --experts E --hidden H --intermediate F --top-k K    the layer's shape (required)
  --dtype bf16|f16        (default bf16)
  --weight-quant SCHEME   FP8 weights, routed and shared: fp8_per_tensor, fp8_per_channel
                          or fp8_block128 (default none: weights in --dtype)
  --routing softmax|sigmoid|grouped    grouped: --groups G --topk-group TG (softmax
                          scores unless --scoring sigmoid)
  --scoring softmax|sigmoid
  --groups G --topk-group TG
  --correction-bias       a per-expert routing bias (DeepSeek-V3 style)
  --routed-scaling-factor X
  --shared S              the shared expert's width (0: none, the fused_moe op)
  --local-experts LO-HI   expert parallelism: the layer holds experts LO..HI of E
  --tokens LIST           e.g. 1-16,24,32 (default 1-16,24,32,48,64,96,128,192,256,384,512,
                          1024,2048,4096,8192,16384)
  --out FILE              the table (default tuned.table); FILE.partial keeps the
                          measurements a re-run resumes from (--partial FILE to name it)
  --no-skew               uniform routing only (default: uniform and skewed)
  --rounds N --max-ms MS --seed N    the bench's timing settings (the finalists')
  --finalists N           per count and routing, every candidate is screened (one round
                          of --screen-ms MS, default 20) and the default plus the N
                          fastest accurate ones (default 4) are timed with the full
                          method; 0 times every candidate with it
  --dry-run               print the candidates each count would measure and exit
  --verify-builtin        no tuning: run every plan the built-in tables name for this GPU,
                          at the ends of each entry's served counts, against the reference
  --verify FILE           the same for the entries of a table file
)";
}

TuneOptions parse_tune_options(const std::vector<std::string>& args) {
  TuneOptions o;
  std::string routing;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto val = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(a + ": expected a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--model") {
      o.model = val();
    } else if (a == "--experts") {
      o.E = integer(a, val(), 1);
    } else if (a == "--hidden") {
      o.H = integer(a, val(), 1);
    } else if (a == "--intermediate") {
      o.F = integer(a, val(), 1);
    } else if (a == "--top-k") {
      o.top_k = static_cast<int>(integer(a, val(), 1));
    } else if (a == "--dtype") {
      o.dtype = val();
      if (o.dtype != "bf16" && o.dtype != "f16")
        throw std::invalid_argument("--dtype: expected bf16 or f16, got '" + o.dtype + "'");
    } else if (a == "--weight-quant") {
      const std::string v = val();
      if (!parse_quant_scheme(v, &o.quant))
        throw std::invalid_argument(
            "--weight-quant: expected none, fp8_per_tensor, fp8_per_channel or fp8_block128, "
            "got '" +
            v + "'");
    } else if (a == "--routing") {
      routing = val();
      if (routing != "softmax" && routing != "sigmoid" && routing != "grouped")
        throw std::invalid_argument("--routing: expected softmax, sigmoid or grouped, got '" +
                                    routing + "'");
      if (routing != "grouped") o.scoring = routing;
    } else if (a == "--scoring") {
      o.scoring = val();
      if (o.scoring != "softmax" && o.scoring != "sigmoid")
        throw std::invalid_argument("--scoring: expected softmax or sigmoid, got '" + o.scoring +
                                    "'");
    } else if (a == "--groups") {
      o.groups = static_cast<int>(integer(a, val(), 1));
    } else if (a == "--topk-group") {
      o.topk_group = static_cast<int>(integer(a, val(), 1));
    } else if (a == "--correction-bias") {
      o.correction_bias = true;
    } else if (a == "--routed-scaling-factor") {
      o.routed_scaling_factor = number(a, val());
    } else if (a == "--shared") {
      o.S = integer(a, val(), 0);
    } else if (a == "--local-experts") {
      const std::string v = val();
      const size_t dash = v.find('-');
      if (dash == std::string::npos)
        throw std::invalid_argument("--local-experts: expected LO-HI, got '" + v + "'");
      o.experts_lo = integer(a, v.substr(0, dash), 0);
      o.experts_hi = integer(a, v.substr(dash + 1), o.experts_lo);
    } else if (a == "--tokens") {
      o.tokens = counts(a, val());
    } else if (a == "--out") {
      o.out = val();
    } else if (a == "--partial") {
      o.partial = val();
    } else if (a == "--no-skew") {
      o.skewed = false;
    } else if (a == "--rounds") {
      o.rounds = static_cast<int>(integer(a, val(), 1));
    } else if (a == "--max-ms") {
      o.max_ms = number(a, val());
    } else if (a == "--finalists") {
      o.finalists = static_cast<int>(integer(a, val(), 0));
    } else if (a == "--screen-ms") {
      o.screen_ms = number(a, val());
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(integer(a, val(), 0));
    } else if (a == "--dry-run") {
      o.dry_run = true;
    } else if (a == "--verify-builtin") {
      o.verify_builtin = true;
    } else if (a == "--verify") {
      o.verify_file = val();
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (--help lists them)");
    }
  }
  if (o.help) return o;
  if (verifying(o)) {
    if (o.E || o.H || o.F || o.dry_run)
      throw std::invalid_argument(
          "--verify-builtin / --verify take the shapes from the tables: no layer options");
    if (o.verify_builtin && !o.verify_file.empty())
      throw std::invalid_argument("--verify-builtin or --verify FILE, not both");
    return o;
  }
  if (o.E == 0 || o.H == 0 || o.F == 0)
    throw std::invalid_argument("--experts, --hidden and --intermediate are required");
  if (o.top_k > o.E) throw std::invalid_argument("--top-k: expected at most --experts");
  if ((routing == "grouped") != (o.groups > 0))
    throw std::invalid_argument("--routing grouped goes with --groups G --topk-group TG");
  if (o.groups > 0 && (o.topk_group < 1 || o.topk_group > o.groups || o.E % o.groups != 0))
    throw std::invalid_argument("--groups / --topk-group: expected G dividing E, 1 <= TG <= G");
  if (o.experts_lo >= 0 && o.experts_hi >= o.E)
    throw std::invalid_argument("--local-experts: expected HI < --experts");
  if (o.tokens.empty()) o.tokens = default_token_counts();
  return o;
}

std::vector<int64_t> default_token_counts() {
  std::vector<int64_t> t(16);
  std::iota(t.begin(), t.end(), 1);
  for (int64_t T : {24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192, 16384})
    t.push_back(T);
  return t;
}

double expert_load_ratio(int64_t E, int top_k, double alpha, int64_t tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> bias(E), logit(E);
  for (int64_t e = 0; e < E; ++e) bias[e] = -alpha * std::log1p(static_cast<double>(e));
  std::vector<int64_t> load(E, 0), order(E);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < E; ++e) logit[e] = normal(rng) + bias[e];
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + (top_k - 1), order.end(),
                     [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
    for (int k = 0; k < top_k; ++k) ++load[order[k]];
  }
  const double mean = static_cast<double>(tokens) * top_k / static_cast<double>(E);
  return static_cast<double>(*std::max_element(load.begin(), load.end())) / mean;
}

double skew_alpha_for(int64_t E, int top_k, double target, int64_t tokens, uint64_t seed) {
  // The busiest expert's share grows with alpha (rank 0's bias stays 0, the others fall).
  // Uniform routing already has a busiest expert above the mean; at most E / top_k times it.
  double lo = 0, hi = 1;
  if (expert_load_ratio(E, top_k, 0, tokens, seed) >= target) return 0;
  while (expert_load_ratio(E, top_k, hi, tokens, seed) < target && hi < 64) hi *= 2;
  for (int i = 0; i < 30 && hi - lo > 1e-4; ++i) {
    const double mid = (lo + hi) / 2;
    (expert_load_ratio(E, top_k, mid, tokens, seed) < target ? lo : hi) = mid;
  }
  return hi;
}

bool verifying(const TuneOptions& o) {
  return o.verify_builtin || !o.verify_file.empty();
}

TuneOptions options_for_entry(const TuningEntry& e) {
  TuneOptions o;
  o.model = e.source;
  o.dtype = e.shape.dtype;
  o.quant = e.shape.quant;
  o.E = e.shape.E;
  o.H = e.shape.H;
  o.F = e.shape.F;
  o.S = e.shape.S;
  o.top_k = e.shape.top_k;
  const std::string& r = e.shape.routing;
  const size_t space = r.find(' ');
  o.scoring = r.substr(0, space);
  int consumed = 0;
  const bool scoring_ok = o.scoring == "softmax" || o.scoring == "sigmoid";
  const bool groups_ok =
      space == std::string::npos || (std::sscanf(r.c_str() + space, " groups %d/%d%n", &o.groups,
                                                 &o.topk_group, &consumed) == 2 &&
                                     space + consumed == r.size());
  if (!scoring_ok || !groups_ok)
    throw std::invalid_argument(e.source + ": routing '" + r +
                                "' is not 'softmax' / 'sigmoid' [groups G/TG]");
  return o;
}

std::vector<int64_t> verify_counts(const TuningEntry& e) {
  std::vector<int64_t> t;
  for (const TokenRange& r : e.tokens) {
    t.push_back(r.lo);
    t.push_back(r.hi);
  }
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

bench::Row layer_row(const TuneOptions& o, int64_t T) {
  const int64_t E = o.local_experts();
  bench::Row r;
  r.dtype = o.dtype;
  bench::Workload& w = r.w;
  w.op = o.S > 0 ? "FusedMoESharedExpertFwd" : "FusedMoEFwd";
  w.name = o.model + "-t" + std::to_string(T);
  w.dtypes = {o.dtype};
  w.tensors = {{"hidden_states", {T, o.H}, ""},
               {"gating_output", {T, E}, "f32"},
               {"w_gate_up", {E, 2 * o.F, o.H}, ""},
               {"w_down", {E, o.H, o.F}, ""}};
  if (o.correction_bias) w.tensors.push_back({"correction_bias", {E}, "f32"});
  if (o.S > 0) {
    w.tensors.push_back({"shared_w_gate_up", {2 * o.S, o.H}, ""});
    w.tensors.push_back({"shared_w_down", {o.H, o.S}, ""});
  }
  w.params["top_k"] = std::to_string(o.top_k);
  w.params["renormalize"] = "true";
  w.params["scoring_func"] = o.scoring;
  if (o.groups > 0) {
    w.params["num_expert_group"] = std::to_string(o.groups);
    w.params["topk_group"] = std::to_string(o.topk_group);
  }
  if (o.routed_scaling_factor != 1)
    w.params["routed_scaling_factor"] = std::to_string(o.routed_scaling_factor);
  // The bench's FP8 weights (e4m3 codes and the scheme's f32 scales), shared ones too.
  if (o.quant != QuantScheme::kNone) w.params["weight_quant"] = quant_scheme_name(o.quant);
  return r;
}

namespace {

// Null-data scale views of `q` in its layout (moekit/quant.h) for weights [E,] 2F x H and
// H x F (E = 0: a dense MLP's, no E axis): the planners read shapes only.
WeightQuant null_scales(QuantScheme q, int64_t E, int64_t F, int64_t H) {
  WeightQuant w;
  w.scheme = q;
  if (q == QuantScheme::kNone) return w;
  const std::vector<int64_t> gu = weight_scale_shape(q, E, 2 * F, H, E > 0);
  const std::vector<int64_t> dn = weight_scale_shape(q, E, H, F, E > 0);
  w.w_gate_up_scale = make_view(nullptr, DType::kF32, static_cast<int>(gu.size()), gu.data());
  w.w_down_scale = make_view(nullptr, DType::kF32, static_cast<int>(dn.size()), dn.data());
  return w;
}

}  // namespace

std::vector<LayerPlan> layer_candidates(const TuneOptions& o, int64_t T, LayerPlan* planned) {
  const int64_t E = o.local_experts();
  const DType dt = o.dtype == "f16" ? DType::kF16 : DType::kBF16;
  const DType wt = o.quant == QuantScheme::kNone ? dt : DType::kFP8E4M3;
  FusedMoESharedExpertArgs a;
  a.moe.hidden_states = make_view(nullptr, dt, {T, o.H});
  a.moe.gating_output = make_view(nullptr, DType::kF32, {T, E});
  a.moe.w_gate_up = make_view(nullptr, wt, {E, 2 * o.F, o.H});
  a.moe.w_down = make_view(nullptr, wt, {E, o.H, o.F});
  a.moe.quant = null_scales(o.quant, E, o.F, o.H);
  a.moe.params.top_k = o.top_k;
  a.moe.params.scoring_func =
      o.scoring == "sigmoid" ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  a.moe.params.num_expert_group = o.groups;
  a.moe.params.topk_group = o.topk_group;
  if (o.S == 0) {
    if (planned) *planned = plan_fused_moe(a.moe);
    return fused_moe_plan_candidates(a.moe);
  }
  a.shared_w_gate_up = make_view(nullptr, wt, {2 * o.S, o.H});
  a.shared_w_down = make_view(nullptr, wt, {o.H, o.S});
  a.shared_quant = null_scales(o.quant, 0, o.S, o.H);
  if (planned) *planned = plan_fused_moe_shared_expert(a);
  return fused_moe_shared_expert_plan_candidates(a);
}

// ---- screening ------------------------------------------------------------------------------

std::vector<bool> pick_finalists(const std::vector<Measurement>& screened, int n,
                                 const std::set<std::string>& keep) {
  std::vector<bool> pick(screened.size(), n <= 0);
  if (n <= 0) return pick;
  std::vector<size_t> order;
  for (size_t i = 0; i < screened.size(); ++i) {
    const Measurement& m = screened[i];
    if (m.is_default || (m.accurate && keep.count(m.plan))) {
      pick[i] = true;
    } else if (m.accurate && m.us > 0) {
      order.push_back(i);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return screened[a].us < screened[b].us; });
  for (size_t j = 0; j < order.size() && j < static_cast<size_t>(n); ++j) pick[order[j]] = true;
  return pick;
}

// ---- the partial-results file -------------------------------------------------------------

std::string partial_header(const TuneOptions& o) {
  const TuningShape s = o.shape();
  return kPartialHeaderPrefix + s.op + " " + detail::tuning_dtype_field(s) +
         " E=" + std::to_string(s.E) + " H=" + std::to_string(s.H) + " F=" + std::to_string(s.F) +
         " K=" + std::to_string(s.top_k) + " " + s.routing + " S=" + std::to_string(s.S) +
         " experts=" + o.experts_field() + " seed=" + std::to_string(o.seed);
}

std::vector<Measurement> read_partial(const std::string& text, const std::string& header,
                                      const std::string& name) {
  std::vector<Measurement> out;
  std::stringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const auto fail = [&](const std::string& why) {
      throw std::runtime_error(name + ":" + std::to_string(n) + ": " + why);
    };
    if (n == 1) {
      if (line != header)
        fail("the results of another run ('" + line + "', this run: '" + header +
             "'): delete it or pass another --partial");
      continue;
    }
    if (line.empty() || line[0] == '#') continue;  // '#': a step's screening summary
    Measurement m;
    std::string why;
    if (!parse_measurement(line, &m, &why)) fail(why);
    LayerPlan plan;
    if (!parse_plan(m.plan, &plan, &why)) fail("plan: " + why);
    out.push_back(m);
  }
  return out;
}

// ---- from measurements to entries -----------------------------------------------------------

namespace {

struct CountResults {
  std::map<std::string, std::map<std::string, const Measurement*>> by_routing;  // routing, plan
  std::map<std::string, const Measurement*> defaults;                           // by routing
};

// The plan's mean ratio to the default at one count over the routings; < 0 when it was not
// measured under every routing or is not accurate.
double mean_ratio(const CountResults& c, const std::string& plan) {
  double sum = 0;
  int n = 0;
  for (const auto& [routing, plans] : c.by_routing) {
    const auto it = plans.find(plan);
    const auto d = c.defaults.find(routing);
    if (it == plans.end() || d == c.defaults.end() || !it->second->accurate ||
        !(it->second->us > 0) || !(d->second->us > 0))
      return -1;
    sum += it->second->us / d->second->us;
    ++n;
  }
  return n ? sum / n : -1;
}

}  // namespace

std::vector<TuningEntry> build_entries(const TuneOptions& o, const std::string& device,
                                       const std::vector<Measurement>& ms,
                                       std::vector<std::string>* log) {
  std::map<int64_t, CountResults> counts;
  std::set<std::string> routings;
  for (const Measurement& m : ms) {
    CountResults& c = counts[m.tokens];
    c.by_routing[m.routing][m.plan] = &m;
    if (m.is_default) c.defaults[m.routing] = &m;
    routings.insert(m.routing);
  }
  // The winner per count (a count whose default was not measured accurately has none).
  std::vector<std::pair<int64_t, std::string>> winners;
  for (const auto& [T, c] : counts) {
    std::string best;
    double best_ratio = 1;
    for (const auto& [plan, m] : c.by_routing.begin()->second) {
      const double r = mean_ratio(c, plan);
      if (r > 0 && r < best_ratio && c.by_routing.size() == routings.size()) {
        best_ratio = r;
        best = plan;
      }
    }
    winners.push_back({T, best});
  }
  const auto timings = [&](const std::vector<int64_t>& Ts, const std::string& plan,
                           const std::string& routing) {
    std::vector<CountTiming> out;
    for (int64_t T : Ts) {
      const CountResults& c = counts.at(T);
      const auto& plans = c.by_routing.at(routing);
      const auto it = plans.find(plan);
      const auto d = c.defaults.find(routing);
      const bool ok = it != plans.end() && it->second->accurate && d != c.defaults.end();
      out.push_back({T, ok ? it->second->us : -1, ok ? d->second->us : -1});
    }
    return out;
  };
  const auto accepted = [&](const std::vector<int64_t>& Ts, const std::string& plan,
                            std::string* why) {
    for (const std::string& routing : routings) {
      const GuardrailVerdict v = guardrail(timings(Ts, plan, routing));
      if (!v.accepted) {
        *why = routing + ": " + v.reason;
        return false;
      }
    }
    return true;
  };
  const auto entry = [&](const std::vector<int64_t>& Ts, const std::string& plan) {
    TuningEntry e;
    e.device = device;
    e.shape = o.shape();
    e.experts = o.experts_field();
    e.tokens = detail::token_ranges(Ts);
    e.plan = plan;
    // The table's times: uniform routing's where measured.
    const std::string routing = routings.count("uniform") ? "uniform" : *routings.begin();
    for (const CountTiming& t : timings(Ts, plan, routing)) {
      e.time_us += t.tuned_us / static_cast<double>(Ts.size());
      e.default_us += t.default_us / static_cast<double>(Ts.size());
    }
    return e;
  };
  std::vector<TuningEntry> out;
  for (size_t i = 0; i < winners.size();) {
    size_t j = i;
    std::vector<int64_t> Ts;
    while (j < winners.size() && winners[j].second == winners[i].second)
      Ts.push_back(winners[j++].first);
    const std::string& plan = winners[i].second;
    const std::string counts_text = detail::format_token_ranges(detail::token_ranges(Ts));
    std::string why;
    if (plan.empty()) {
      if (log) log->push_back(counts_text + ": the default plan (no faster accurate candidate)");
    } else if (accepted(Ts, plan, &why)) {
      out.push_back(entry(Ts, plan));
      if (log) log->push_back(counts_text + ": " + plan);
    } else {
      if (log) log->push_back(counts_text + ": " + plan + " refused (" + why + "), per count:");
      for (int64_t T : Ts) {
        std::string why1;
        if (accepted({T}, plan, &why1)) {
          out.push_back(entry({T}, plan));
          if (log) log->push_back("  " + std::to_string(T) + ": " + plan);
        } else if (log) {
          log->push_back("  " + std::to_string(T) + ": the default (" + why1 + ")");
        }
      }
    }
    i = j;
  }
  return out;
}

}  // namespace moekit::tune
