// The tuned layer's picture's inputs (plot_tune.h): moekit-tune's partial file, its table
// (the columns of docs/tuning.md "The format", read by name: the library's parser needs the
// library, and the picture only needs the entries' counts and plans) and a bench run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "plot_run.h"
#include "plot_tune.h"

namespace moekit::bench::plot {
namespace {

[[noreturn]] void fail(const std::string& name, int line, const std::string& why) {
  throw std::runtime_error(name + ":" + std::to_string(line) + ": " + why);
}

// "E=128" -> "128" when `word` starts with `key`=; "" otherwise.
std::string value_of(const std::string& word, const std::string& key) {
  return word.rfind(key + "=", 0) == 0 ? word.substr(key.size() + 1) : "";
}

// "1-16,24" -> {1, 16}, {24, 24}; false unless ascending counts >= 1.
bool parse_ranges(const std::string& text, std::vector<std::pair<int64_t, int64_t>>* out) {
  std::stringstream in(text);
  std::string part;
  int64_t last = 0;
  while (std::getline(in, part, ',')) {
    const size_t dash = part.find('-');
    long long lo = 0, hi = 0;
    char extra = 0;
    const std::string lo_text = part.substr(0, dash);
    const std::string hi_text = dash == std::string::npos ? lo_text : part.substr(dash + 1);
    if (std::sscanf(lo_text.c_str(), "%lld%c", &lo, &extra) != 1 ||
        std::sscanf(hi_text.c_str(), "%lld%c", &hi, &extra) != 1 || lo <= last || hi < lo)
      return false;
    out->emplace_back(lo, hi);
    last = hi;
  }
  return !out->empty();
}

}  // namespace

TunedLayer read_tuned_layer(const std::string& text, const std::string& name) {
  TunedLayer layer;
  std::stringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line.rfind(tune::kPartialHeaderPrefix, 0) != 0)
    fail(name, 1,
         "not a moekit-tune partial file (its first line starts '" +
             std::string(tune::kPartialHeaderPrefix) + "')");
  // OP DTYPE (words: "bf16", or "bf16 fp8_per_tensor" for FP8 weights) E= H= F= K=
  // ROUTING (words) S= experts= seed=
  layer.shape = line.substr(std::string(tune::kPartialHeaderPrefix).size());
  std::vector<std::string> w;
  std::stringstream words(layer.shape);
  for (std::string word; words >> word;) w.push_back(word);
  size_t e = 1;  // the E= word, after the dtype's words
  while (e < w.size() && value_of(w[e], "E").empty()) ++e;
  size_t s = e + 4;  // the S= word, after the routing's words
  while (s < w.size() && value_of(w[s], "S").empty()) ++s;
  if (e == 1 || w.size() != s + 3 || s == e + 4 || value_of(w[e + 1], "H").empty() ||
      value_of(w[e + 2], "F").empty() || value_of(w[e + 3], "K").empty() ||
      value_of(w[s + 1], "experts").empty())
    fail(name, 1,
         "expected 'OP DTYPE E=.. H=.. F=.. K=.. ROUTING S=.. experts=.. seed=..' after the "
         "prefix, got '" +
             layer.shape + "'");
  layer.op = w[0];
  for (size_t i = 1; i < e; ++i) layer.dtype += (i > 1 ? " " : "") + w[i];
  std::string routing;
  for (size_t i = e + 4; i < s; ++i) routing += (i > e + 4 ? " " : "") + w[i];
  layer.key = layer.op + "|" + layer.dtype + "|" + value_of(w[e], "E") + "|" +
              value_of(w[e + 1], "H") + "|" + value_of(w[e + 2], "F") + "|" +
              value_of(w[e + 3], "K") + "|" + routing + "|" + value_of(w[s], "S") + "|" +
              value_of(w[s + 1], "experts");
  for (int n = 2; std::getline(in, line); ++n) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;  // a step's screening note
    tune::Measurement m;
    std::string why;
    if (!tune::parse_measurement(line, &m, &why)) fail(name, n, why);
    if (!std::isfinite(m.us)) m.us = -1;
    layer.ms.push_back(m);
  }
  return layer;
}

bool TableEntry::serves(int64_t T) const {
  for (const auto& [lo, hi] : tokens)
    if (lo <= T && T <= hi) return true;
  return false;
}

std::vector<TableEntry> read_table_entries(const std::string& text, const std::string& name,
                                           const TunedLayer& layer) {
  static const char* const kKey[] = {"op",    "dtype",   "E", "H",      "F",
                                     "top_k", "routing", "S", "experts"};
  std::vector<TableEntry> out;
  std::map<std::string, size_t> column;
  size_t columns = 0;
  std::stringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const std::vector<std::string> f = tune::split_fields(line);
    if (columns == 0) {  // the header
      for (size_t i = 0; i < f.size(); ++i) column[f[i]] = i;
      const auto need = [&](const char* c) {
        if (!column.count(c))
          fail(name, n,
               "expected the table's header 'device | op | ... | plan | ...' (no column '" +
                   std::string(c) + "'), got '" + line + "'");
      };
      for (const char* c : kKey) need(c);
      for (const char* c : {"device", "tokens", "plan"}) need(c);
      columns = f.size();
      continue;
    }
    if (f.size() != columns)
      fail(name, n,
           "expected " + std::to_string(columns) + " '|'-separated fields, got " +
               std::to_string(f.size()));
    std::string key;
    for (const char* c : kKey) key += (key.empty() ? "" : "|") + f[column[c]];
    if (key != layer.key) continue;  // another layer's entry
    TableEntry e;
    if (!parse_ranges(f[column["tokens"]], &e.tokens))
      fail(name, n,
           "field 'tokens': expected ascending counts and ranges (1-16,24), got '" +
               f[column["tokens"]] + "'");
    e.plan = f[column["plan"]];
    if (e.plan.empty()) fail(name, n, "field 'plan': expected a plan, got ''");
    e.device = f[column["device"]];
    e.source = name + ":" + std::to_string(n);
    out.push_back(e);
  }
  if (columns == 0) fail(name, 1, "expected the table's header 'device | op | ... | plan | ...'");
  return out;
}

BenchSeries read_bench_series(const TunePlotInputs& in, const TunedLayer& layer) {
  BenchSeries s;
  Run run;
  try {
    run = parse_run(in.bench_text);
  } catch (const std::exception& e) {
    throw std::runtime_error(in.bench_name + ": " + e.what());
  }
  s.device = run.device;
  s.op = !in.op.empty()                          ? in.op
         : layer.op == "fused_moe_shared_expert" ? "FusedMoESharedExpertFwd"
                                                 : "FusedMoEFwd";
  // A record's dtype is the activations' ("bf16"); an FP8 layer's dtype field adds its scheme.
  const std::string act_dtype = layer.dtype.substr(0, layer.dtype.find(' '));
  std::set<std::string> workloads;
  for (const Record& r : run.records)
    if (r.op == s.op && r.dtype == act_dtype && r.tokens > 0) workloads.insert(r.base_workload);
  std::string there;
  for (const std::string& w : workloads) there += (there.empty() ? "" : ", ") + w;
  if (!in.workload.empty()) {
    if (!workloads.count(in.workload))
      throw std::runtime_error(in.bench_name + ": no --tokens records of " + s.op + " " +
                               layer.dtype + " workload '" + in.workload +
                               "' (there: " + (there.empty() ? "none" : there) + ")");
    s.workload = in.workload;
  } else if (workloads.size() == 1) {
    s.workload = *workloads.begin();
  } else {
    throw std::runtime_error(in.bench_name + ": " +
                             (workloads.empty()
                                  ? "no --tokens records of " + s.op + " " + layer.dtype
                                  : "records of several workloads (" + there + "): name one"));
  }
  for (const Record& r : run.records) {
    if (r.op != s.op || r.dtype != act_dtype || r.base_workload != s.workload || r.tokens <= 0)
      continue;
    BenchPoint p;
    p.tokens = r.tokens;
    p.ideal_us = r.ideal_ms > 0 ? r.ideal_ms * 1e3 : -1;
    for (const auto& [alt, ms] : r.alternatives)
      if (r.measured() && ms > 0 &&
          (p.best_alternative_us < 0 || ms * 1e3 < p.best_alternative_us)) {
        p.best_alternative_us = ms * 1e3;
        p.best_alternative = alt;
      }
    s.points.push_back(p);
  }
  std::stable_sort(s.points.begin(), s.points.end(),
                   [](const BenchPoint& a, const BenchPoint& b) { return a.tokens < b.tokens; });
  return s;
}

std::vector<RoutingSeries> tuned_series(const TunedLayer& layer,
                                        const std::vector<TableEntry>* table) {
  std::set<int64_t> measured;
  for (const tune::Measurement& m : layer.ms) measured.insert(m.tokens);
  if (table)
    for (const TableEntry& e : *table)
      for (const auto& [lo, hi] : e.tokens)
        for (int64_t T = lo; T <= hi; ++T)  // stops at the first count missing
          if (!measured.count(T))
            throw std::runtime_error(e.source +
                                     ": field 'tokens': serves T = " + std::to_string(T) +
                                     ", which the partial file did not measure");
  std::vector<RoutingSeries> out;
  for (const char* routing : {"uniform", "skewed"}) {
    std::map<int64_t, std::vector<const tune::Measurement*>> at;  // by count
    for (const tune::Measurement& m : layer.ms)
      if (m.routing == routing) at[m.tokens].push_back(&m);
    if (at.empty()) continue;
    RoutingSeries rs{routing, {}};
    for (const auto& [T, ms] : at) {
      TunedPoint p;
      p.tokens = T;
      for (const tune::Measurement* m : ms)
        if (m->is_default) p.def = m;
      p.tuned = p.def;
      const TableEntry* entry = nullptr;
      if (table)
        for (const TableEntry& e : *table)
          if (e.serves(T)) entry = entry ? entry : &e;
      if (entry) {
        p.tuned = nullptr;
        for (const tune::Measurement* m : ms)
          if (m->plan == entry->plan) p.tuned = m;
        if (!p.tuned)
          throw std::runtime_error(
              entry->source + ": plan '" + entry->plan + "' serves T = " + std::to_string(T) +
              " but the partial file has no " + routing + " measurement of it there");
        p.from_entry = true;
      } else if (!table) {
        for (const tune::Measurement* m : ms)
          if (m->accurate && m->us > 0 && (!p.tuned || !(p.tuned->us > 0) || m->us < p.tuned->us))
            p.tuned = m;
        p.from_entry = p.tuned != p.def;
      }
      rs.points.push_back(p);
    }
    out.push_back(rs);
  }
  return out;
}

}  // namespace moekit::bench::plot
