// The tuning tables' text format (docs/tuning.md "The format"): '|'-separated columns, one
// entry a line, '#' comments, a header line naming the columns. The library parses it
// itself (nlohmann-json is a test / bench dependency only, and a consumer that builds
// moekit as a subproject gets the library alone); one line per entry diffs line by line.
#include "moe/tuning_table.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "moekit/error.h"

namespace moekit {

bool TuningShape::operator==(const TuningShape& o) const {
  return op == o.op && dtype == o.dtype && quant == o.quant && E == o.E && H == o.H && F == o.F &&
         top_k == o.top_k && routing == o.routing && S == o.S;
}

std::string routing_name(const TopKParams& params) {
  std::string name = params.scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "softmax";
  if (params.num_expert_group > 0)
    name += " groups " + std::to_string(params.num_expert_group) + "/" +
            std::to_string(params.topk_group);
  return name;
}

GuardrailVerdict guardrail(const std::vector<CountTiming>& served) {
  // The edges (exactly 1% / 2%) pass despite the ratios' rounding.
  constexpr double kTolerance = 1e-9;
  GuardrailVerdict v;
  if (served.empty()) {
    v.reason = "no token count measured";
    return v;
  }
  double sum = 0;
  for (const CountTiming& c : served) {
    if (!(c.tuned_us > 0) || !(c.default_us > 0)) {
      v.reason = "T = " + std::to_string(c.tokens) + " not measured";
      return v;
    }
    const double ratio = c.tuned_us / c.default_us;
    sum += 1 / ratio - 1;
    if (ratio > v.worst_ratio) v.worst_ratio = ratio;
    if (ratio > 1 + kGuardrailMaxSlowdown + kTolerance && v.reason.empty()) {
      char why[96];
      std::snprintf(why, sizeof why, "T = %lld is %.1f%% slower (more than 2%%)",
                    static_cast<long long>(c.tokens), (ratio - 1) * 100);
      v.reason = why;
    }
  }
  v.mean_speedup = sum / static_cast<double>(served.size());
  if (v.reason.empty() && v.mean_speedup < kGuardrailMinMeanSpeedup - kTolerance)
    v.reason = "under 1% faster on average";
  v.accepted = v.reason.empty();
  return v;
}

namespace detail {

const char* const kTuningColumns[14] = {"device", "op",    "dtype",   "E",         "H",
                                        "F",      "top_k", "routing", "S",         "experts",
                                        "tokens", "plan",  "time_us", "default_us"};

namespace {

enum Column {
  kDevice,
  kOp,
  kDtype,
  kE,
  kH,
  kF,
  kTopK,
  kRouting,
  kS,
  kExperts,
  kTokens,
  kPlan,
  kTimeUs,
  kDefaultUs,
  kColumns
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, sep)) out.push_back(trim(field));
  if (!line.empty() && line.back() == sep) out.push_back("");
  return out;
}

// One line's reader: every failure names the table, the line and the field.
class LineReader {
 public:
  LineReader(const std::string& name, int line, const std::vector<std::string>& fields)
      : name_(name), line_(line), fields_(fields) {}

  [[noreturn]] void fail(int column, const std::string& expected) const {
    throw Error(where() + ": field '" + kTuningColumns[column] + "': expected " + expected +
                ", got '" + fields_[column] + "'");
  }
  std::string where() const { return name_ + ":" + std::to_string(line_); }
  const std::string& text(int column) const { return fields_[column]; }

  // A decimal integer in [lo, hi].
  int64_t integer(int column, int64_t lo, int64_t hi, const std::string& what) const {
    return parse_int(fields_[column], lo, hi, [&] { fail(column, what); });
  }

  double positive(int column) const {
    const std::string& s = fields_[column];
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || !(v > 0))
      fail(column, "a time in microseconds > 0");
    return v;
  }

  template <class Fail>
  static int64_t parse_int(const std::string& s, int64_t lo, int64_t hi, Fail fail) {
    if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos)
      fail();
    const int64_t v = std::stoll(s);
    if (v < lo || v > hi) fail();
    return v;
  }

 private:
  const std::string& name_;
  int line_;
  const std::vector<std::string>& fields_;
};

constexpr int64_t kMaxDim = int64_t{1} << 31;

std::string read_routing(const LineReader& r, int64_t E) {
  const std::string& s = r.text(kRouting);
  const char* expected = "'softmax' or 'sigmoid', optionally ' groups G/TG' (G divides E, TG <= G)";
  std::string scoring = s.substr(0, s.find(' '));
  if (scoring != "softmax" && scoring != "sigmoid") r.fail(kRouting, expected);
  if (scoring.size() == s.size()) return s;
  const std::string rest = s.substr(scoring.size());
  if (rest.compare(0, 8, " groups ") != 0) r.fail(kRouting, expected);
  const std::vector<std::string> g = split(rest.substr(8), '/');
  const auto bad = [&] { r.fail(kRouting, expected); };
  if (g.size() != 2) bad();
  const int64_t groups = LineReader::parse_int(g[0], 1, E, bad);
  const int64_t topk_group = LineReader::parse_int(g[1], 1, groups, bad);
  if (E % groups != 0 ||
      std::to_string(groups) + "/" + std::to_string(topk_group) != rest.substr(8))
    bad();
  return s;
}

std::vector<TokenRange> read_tokens(const LineReader& r) {
  const char* expected = "ascending token counts and ranges, e.g. '1-16,24,32' (counts >= 1)";
  const auto bad = [&] { r.fail(kTokens, expected); };
  std::vector<TokenRange> out;
  for (const std::string& part : split(r.text(kTokens), ',')) {
    const size_t dash = part.find('-');
    TokenRange t;
    t.lo = LineReader::parse_int(part.substr(0, dash), 1, kMaxDim, bad);
    t.hi = dash == std::string::npos
               ? t.lo
               : LineReader::parse_int(part.substr(dash + 1), t.lo, kMaxDim, bad);
    if (!out.empty() && t.lo <= out.back().hi) bad();
    out.push_back(t);
  }
  if (out.empty()) bad();
  return out;
}

// Each served range's ends must be runnable by this build on `device`: the rejection check of
// a forced plan, not membership in layer_plan_candidates. The candidates vary one part with the
// others as planned, and the planned parts follow measured device facts (the split-K
// co-resident clusters differ between chips of one name), so a plan tuned on one H200 need
// not be a candidate on another, yet runs there.
void check_runnable(const LineReader& r, const ParsedEntry& e, const TuningDevice& device) {
  for (const TokenRange& range : e.entry.tokens) {
    for (int64_t T : {range.lo, range.hi}) {
      const std::string why =
          layer_plan_rejection(e.plan, tuning_problem(e.entry.shape, T), device.gemm);
      if (why.empty()) continue;
      r.fail(kPlan, "a plan this build can run for the shape at T = " + std::to_string(T) + " on " +
                        device.name + " (this one cannot: " + why + ")");
    }
  }
}

bool overlaps(const std::vector<TokenRange>& a, const std::vector<TokenRange>& b) {
  for (const TokenRange& x : a)
    for (const TokenRange& y : b)
      if (x.lo <= y.hi && y.lo <= x.hi) return true;
  return false;
}

// "bf16" / "f16", then the weights' FP8 scheme where they are quantized: "bf16 fp8_block128".
void read_dtype(const LineReader& r, TuningShape* shape) {
  const std::vector<std::string> words = split(r.text(kDtype), ' ');
  const auto bad = [&] {
    r.fail(kDtype,
           "'bf16' or 'f16', then the weights' scheme if FP8 (fp8_per_tensor, fp8_per_channel, "
           "fp8_block128)");
  };
  if (words.empty() || words.size() > 2 || (words[0] != "bf16" && words[0] != "f16")) bad();
  shape->dtype = words[0];
  shape->quant = QuantScheme::kNone;
  if (words.size() == 2 &&
      (!parse_quant_scheme(words[1], &shape->quant) || shape->quant == QuantScheme::kNone))
    bad();
}

ParsedEntry read_entry(const LineReader& r, const TuningDevice* check) {
  ParsedEntry e;
  TuningEntry& t = e.entry;
  t.source = r.where();
  t.device = r.text(kDevice);
  if (t.device.empty()) r.fail(kDevice, "a device name (cudaDeviceProp::name)");
  t.shape.op = r.text(kOp);
  if (t.shape.op != "fused_moe" && t.shape.op != "fused_moe_shared_expert")
    r.fail(kOp, "'fused_moe' or 'fused_moe_shared_expert'");
  read_dtype(r, &t.shape);
  t.shape.E = r.integer(kE, 1, kMaxDim, "experts >= 1");
  t.shape.H = r.integer(kH, 1, kMaxDim, "a hidden size >= 1");
  t.shape.F = r.integer(kF, 1, kMaxDim, "an intermediate size >= 1");
  t.shape.top_k = static_cast<int>(r.integer(kTopK, 1, t.shape.E, "top_k in [1, E]"));
  t.shape.routing = read_routing(r, t.shape.E);
  t.shape.S = r.integer(kS, 0, t.shape.op == "fused_moe" ? 0 : kMaxDim,
                        t.shape.op == "fused_moe" ? "0 (fused_moe has no shared expert)"
                                                  : "a shared expert width >= 0 (0 = none)");
  t.experts = r.text(kExperts);
  if (t.experts != "all") {
    const auto bad = [&] { r.fail(kExperts, "'all' or 'lo-hi' with hi - lo + 1 = E"); };
    const size_t dash = t.experts.find('-');
    if (dash == std::string::npos) bad();
    const int64_t lo = LineReader::parse_int(t.experts.substr(0, dash), 0, kMaxDim, bad);
    const int64_t hi = LineReader::parse_int(t.experts.substr(dash + 1), lo, kMaxDim, bad);
    if (hi - lo + 1 != t.shape.E) bad();
  }
  t.tokens = read_tokens(r);
  t.plan = r.text(kPlan);
  std::string why;
  if (!parse_plan(t.plan, &e.plan, &why)) r.fail(kPlan, "a layer plan (to_string's form): " + why);
  t.time_us = r.positive(kTimeUs);
  t.default_us = r.positive(kDefaultUs);
  if (check != nullptr && t.device == check->name) check_runnable(r, e, *check);
  return e;
}

}  // namespace

std::vector<ParsedEntry> parse_tuning_table(const std::string& text, const std::string& name,
                                            const TuningDevice* check) {
  std::vector<ParsedEntry> entries;
  std::istringstream in(text);
  std::string line;
  bool header = false;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string body = trim(line);
    if (body.empty() || body[0] == '#') continue;
    std::vector<std::string> fields = split(body, '|');
    if (!header) {
      std::string want;
      for (const char* c : kTuningColumns) want += want.empty() ? c : std::string(" | ") + c;
      if (fields.size() != kColumns || !std::equal(fields.begin(), fields.end(), kTuningColumns))
        throw Error(name + ":" + std::to_string(number) + ": the header: expected '" + want +
                    "', got '" + body + "'");
      header = true;
      continue;
    }
    if (fields.size() != kColumns)
      throw Error(name + ":" + std::to_string(number) + ": expected " + std::to_string(kColumns) +
                  " '|'-separated fields, got " + std::to_string(fields.size()));
    const LineReader r(name, number, fields);
    ParsedEntry e = read_entry(r, check);
    for (const ParsedEntry& o : entries) {
      if (o.entry.device == e.entry.device && o.entry.shape == e.entry.shape &&
          overlaps(o.entry.tokens, e.entry.tokens))
        r.fail(kTokens, "counts no other entry of this device and shape serves (" + o.entry.source +
                            " serves " + format_token_ranges(o.entry.tokens) + ")");
    }
    entries.push_back(std::move(e));
  }
  if (!header)
    throw Error(name + ": expected a header line naming the columns, got an empty table");
  return entries;
}

std::vector<TokenRange> token_ranges(const std::vector<int64_t>& sorted_counts) {
  std::vector<TokenRange> out;
  for (int64_t T : sorted_counts) {
    if (!out.empty() && out.back().hi + 1 == T)
      out.back().hi = T;
    else
      out.push_back({T, T});
  }
  return out;
}

std::string format_token_ranges(const std::vector<TokenRange>& ranges) {
  std::string s;
  for (const TokenRange& r : ranges) {
    if (!s.empty()) s += ",";
    s += std::to_string(r.lo);
    if (r.hi != r.lo) s += "-" + std::to_string(r.hi);
  }
  return s;
}

std::string tuning_dtype_field(const TuningShape& shape) {
  return shape.quant == QuantScheme::kNone ? shape.dtype
                                           : shape.dtype + " " + quant_scheme_name(shape.quant);
}

std::string format_tuning_table(const std::vector<TuningEntry>& entries) {
  std::ostringstream out;
  out << "# moekit tuning table (docs/tuning.md): times are means over the served counts, us\n";
  for (int i = 0; i < kColumns; ++i) out << (i ? " | " : "") << kTuningColumns[i];
  out << "\n";
  for (const TuningEntry& e : entries) {
    const TuningShape& s = e.shape;
    char times[64];
    std::snprintf(times, sizeof times, "%.3f | %.3f", e.time_us, e.default_us);
    out << e.device << " | " << s.op << " | " << tuning_dtype_field(s) << " | " << s.E << " | "
        << s.H << " | " << s.F << " | " << s.top_k << " | " << s.routing << " | " << s.S << " | "
        << e.experts << " | " << format_token_ranges(e.tokens) << " | " << e.plan << " | " << times
        << "\n";
  }
  return out.str();
}

bool serves(const TuningEntry& entry, int64_t T) {
  for (const TokenRange& r : entry.tokens)
    if (T >= r.lo && T <= r.hi) return true;
  return false;
}

LayerProblem tuning_problem(const TuningShape& shape, int64_t T) {
  LayerProblem p;
  p.s.dtype = shape.dtype == "f16" ? DType::kF16 : DType::kBF16;
  p.s.T = T;
  p.s.H = shape.H;
  p.s.E = shape.E;
  p.s.F = shape.F;
  p.s.K = shape.top_k;
  p.s.quant = shape.quant;
  p.op = RoutedOp::kLayer;
  p.S = shape.S;
  if (shape.S > 0) p.shared_quant = shape.quant;
  return p;
}

TuningShape layer_tuning_shape(const char* op, const MoEShapes& s, const TopKParams& routing,
                               int64_t S) {
  TuningShape shape;
  shape.op = op;
  shape.dtype = dtype_name(s.dtype);
  shape.quant = s.quant;
  shape.E = s.E;
  shape.H = s.H;
  shape.F = s.F;
  shape.top_k = static_cast<int>(s.K);
  shape.routing = routing_name(routing);
  shape.S = S;
  return shape;
}

}  // namespace detail
}  // namespace moekit
