#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace moekit::bench {

using ojson = nlohmann::ordered_json;

double RowResult::best_alt_ms() const {
  double best = -1;
  for (const AltTime& a : alternatives)
    if (a.ms > 0 && (best < 0 || a.ms < best)) best = a.ms;
  return best;
}

std::string RowResult::best_alt_name() const {
  double best = -1;
  std::string name;
  for (const AltTime& a : alternatives)
    if (a.ms > 0 && (best < 0 || a.ms < best)) {
      best = a.ms;
      name = a.name;
    }
  return name;
}

double RowResult::ratio() const {
  double b = best_alt_ms();
  return (b > 0 && ours_ms > 0) ? b / ours_ms : -1;
}

std::string format_ms(double ms) {
  if (!(ms >= 0)) return "-";
  if (ms == 0) return "0";
  int mag = static_cast<int>(std::floor(std::log10(ms)));
  int decimals = std::max(0, 3 - mag);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, ms);
  return buf;
}

std::string compact_plan(const std::string& plan) {
  static const std::string kGateUp = "{gate_up: ", kDown = ", down: ";
  std::string s = plan;
  for (size_t at = s.find(kGateUp); at != std::string::npos; at = s.find(kGateUp, at + 1)) {
    size_t down = s.find(kDown, at), close = s.find('}', at);
    if (down == std::string::npos || close == std::string::npos || down > close) break;
    std::string a = s.substr(at + kGateUp.size(), down - at - kGateUp.size());
    std::string b = s.substr(down + kDown.size(), close - down - kDown.size());
    s.replace(at, close + 1 - at, "{" + (a == b ? a : a + " / " + b) + "}");
  }
  for (size_t at = s.find(" dynamic"); at != std::string::npos; at = s.find(" dynamic", at))
    s.replace(at, 8, " dyn");
  return s;
}

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string tflops_str(const RowResult& r) {
  if (r.cost.flops <= 0 || r.ours_ms <= 0) return "·";
  double t = r.cost.flops / (r.ours_ms * 1e-3) / 1e12;
  return t >= 100 ? fmt("%.0f", t) : t >= 10 ? fmt("%.1f", t) : fmt("%.3g", t);
}

std::string sol_str(const RowResult& r) {
  if (r.ours_ms <= 0) return "-";
  return fmt("%.0f%%", r.sol.sol * 100);
}

std::string ratio_str(const RowResult& r) {
  double q = r.ratio();
  return q > 0 ? fmt("%.2fx", q) : "—";
}

std::string page_ratio_str(const RowResult& r) {
  if (r.page_ms <= 0 || r.ours_ms <= 0) return "-";
  return fmt("%.2f", r.ours_ms / r.page_ms);
}

std::string active_str(const RowResult& r) {
  if (r.active_experts < 0 || r.num_experts <= 0) return "-";
  return std::to_string(r.active_experts) + "/" + std::to_string(r.num_experts);
}

std::string acc_str(const RowResult& r) {
  if (!r.checked) return "-";
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s %.1e/%.1e", r.acc_pass ? "pass" : "FAIL", r.rel_l2,
                r.err_ratio);
  return buf;
}

std::string alts_str(const RowResult& r, bool markdown) {
  std::string s;
  for (const AltTime& a : r.alternatives) {
    if (!s.empty()) s += markdown ? ", " : "  ";
    s += a.name + (a.external ? "*" : "") + " " + (a.ms > 0 ? format_ms(a.ms) : "n/a");
  }
  return s.empty() ? "·" : s;
}

// "ratio" of a candidate: its time over the row's default plan's (> 1: slower).
std::string candidate_line(const CandidateTime& c, const RowResult& r) {
  std::string s = "candidate " + std::to_string(c.index) + ": " + c.plan + "  " +
                  (c.ms > 0 ? format_ms(c.ms) + " ms" : std::string("not timed"));
  if (c.ms > 0 && r.ours_ms > 0) s += fmt("  %.3fx", c.ms / r.ours_ms);
  if (c.checked) s += c.acc_pass ? "  acc pass" : fmt("  ACC FAIL %.1e", c.rel_l2);
  if (c.plan == r.plan) s += "  (the planner's)";
  if (!c.note.empty()) s += "  " + c.note;
  return s;
}

std::string pad(const std::string& s, size_t w, bool right = false) {
  // Width in code points, so "—" and "·" pad like one character.
  size_t len = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++len;
  if (len >= w) return s;
  return right ? std::string(w - len, ' ') + s : s + std::string(w - len, ' ');
}

std::vector<std::string> op_order(const std::vector<RowResult>& rows) {
  std::vector<std::string> ops;
  for (const RowResult& r : rows) {
    bool seen = false;
    for (const std::string& o : ops) seen = seen || o == r.op;
    if (!seen) ops.push_back(r.op);
  }
  return ops;
}

std::string ceilings_line(const RunMeta& m) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "ceilings: read %.2f TB/s, bf16 %.0f TFLOP/s, fp8 %.0f TFLOP/s (%s)",
                m.ceilings.read_tbps, m.ceilings.bf16_tflops, m.ceilings.fp8_tflops,
                m.ceilings.source.c_str());
  return buf;
}

}  // namespace

std::string launch_floor_line(const RunMeta& m) {
  if (m.launch_floor_ms < 0) return "launch floor: not measured";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "launch floor (empty kernel, graph of back-to-back calls like the lat rows): "
                "1 block %s ms, %d x 1024 threads %s ms",
                format_ms(m.launch_floor_ms).c_str(), m.launch_floor_grid_blocks,
                format_ms(m.launch_floor_grid_ms).c_str());
  return buf;
}

std::vector<std::string> moekit_knobs(const char* const* envp) {
  std::vector<std::string> out;
  for (const char* const* e = envp; e != nullptr && *e != nullptr; ++e)
    if (std::string(*e).rfind("MOEKIT_", 0) == 0) out.emplace_back(*e);
  std::sort(out.begin(), out.end());
  return out;
}

std::string knobs_line(const RunMeta& m) {
  if (m.knobs.empty()) return "knobs: none (library defaults)";
  std::string s = "knobs:";
  for (const std::string& k : m.knobs) s += " " + k;
  return s;
}

std::string render_table(const std::vector<RowResult>& rows, const RunMeta& meta) {
  std::ostringstream os;
  os << "moekit-bench  device: " << meta.device << "  commit: " << meta.commit
     << "  date: " << meta.date << "\n"
     << ceilings_line(meta) << "\n"
     << launch_floor_line(meta) << "\n"
     << knobs_line(meta) << "\n"
     << "ratio = fastest alternative / ours (>1: ours faster); SOL = ideal / measured; "
        "* = external time\n";
  for (const std::string& op : op_order(rows)) {
    os << "\n" << op << "\n";
    const size_t wl = 26;
    size_t wp = 6;  // the plan column: as wide as the op's widest compact plan
    for (const RowResult& r : rows)
      if (r.op == op) wp = std::max(wp, compact_plan(r.plan).size() + 2);
    os << pad("workload", wl) << pad("dtype", 10) << pad("ours ms", 10, true)
       << pad("ratio", 8, true) << "  " << pad("TFLOP/s", 8, true) << pad("SOL", 6, true) << "  "
       << pad("bound", 6) << pad("active", 9) << pad("page ms", 9, true)
       << pad("ours/page", 10, true) << "  " << pad("accuracy rel_l2/err", 22) << pad("plan", wp)
       << "alternatives (ms)\n";
    for (const RowResult& r : rows) {
      if (r.op != op) continue;
      if (r.status != "ok") {
        os << pad(r.workload, wl) << pad(r.dtype, 10) << "  " << r.status << "\n";
        continue;
      }
      os << pad(r.workload, wl) << pad(r.dtype, 10) << pad(format_ms(r.ours_ms), 10, true)
         << pad(ratio_str(r), 8, true) << "  " << pad(tflops_str(r), 8, true)
         << pad(sol_str(r), 6, true) << "  " << pad(r.sol.bound, 6) << pad(active_str(r), 9)
         << pad(format_ms(r.page_ms), 9, true) << pad(page_ratio_str(r), 10, true) << "  "
         << pad(acc_str(r), 22) << pad(compact_plan(r.plan), wp) << alts_str(r, false) << "\n";
      for (const CandidateTime& c : r.candidates) os << "    " << candidate_line(c, r) << "\n";
      for (const AltTime& a : r.alternatives)
        if (!a.note.empty()) os << "    " << a.name << ": " << a.note << "\n";
      for (const std::string& n : r.notes) os << "    note: " << n << "\n";
    }
  }
  return os.str();
}

std::string render_markdown(const std::vector<RowResult>& rows, const RunMeta& meta) {
  std::ostringstream os;
  os << "Device: " << meta.device << " · commit `" << meta.commit << "` · " << meta.date << "  \n"
     << ceilings_line(meta) << "  \n"
     << launch_floor_line(meta) << "  \n"
     << knobs_line(meta) << "\n\n"
     << "Ratio = fastest alternative / ours (>1: ours faster). SOL = ideal / measured, "
        "ideal = max(FLOPs / F_peak, bytes / B_peak). `*` = external time.\n";
  for (const std::string& op : op_order(rows)) {
    os << "\n### " << op << "\n\n"
       << "| Workload | dtype | Ratio | Device time (ms) | Alternatives (ms) | TFLOP/s | SOL | "
          "Bound | Active experts | Page (ms) | Ours / page | Accuracy (rel_l2 / err) | Plan | "
          "Notes |\n"
       << "|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|---|---|---|\n";
    for (const RowResult& r : rows) {
      if (r.op != op) continue;
      if (r.status != "ok") {
        os << "| " << r.workload << " | " << r.dtype << " | | | | | | | | " << format_ms(r.page_ms)
           << " | | | " << r.plan << " | " << r.status << " |\n";
        continue;
      }
      std::string notes;
      for (const AltTime& a : r.alternatives)
        if (!a.note.empty()) notes += (notes.empty() ? "" : "; ") + a.name + ": " + a.note;
      for (const std::string& n : r.notes) notes += (notes.empty() ? "" : "; ") + n;
      os << "| " << r.workload << " | " << r.dtype << " | " << ratio_str(r) << " | "
         << format_ms(r.ours_ms) << " | " << alts_str(r, true) << " | " << tflops_str(r) << " | "
         << sol_str(r) << " | " << r.sol.bound << " | " << active_str(r) << " | "
         << format_ms(r.page_ms) << " | " << page_ratio_str(r) << " | " << acc_str(r) << " | "
         << r.plan << " | " << notes << " |\n";
    }
    bool header = false;
    for (const RowResult& r : rows) {
      if (r.op != op || r.candidates.empty()) continue;
      if (!header) os << "\nPlan candidates (time over the row's default plan):\n\n";
      header = true;
      for (const CandidateTime& c : r.candidates)
        os << "- " << r.workload << " " << r.dtype << ": " << candidate_line(c, r) << "\n";
    }
  }
  return os.str();
}

std::string render_json(const std::vector<RowResult>& rows, const RunMeta& meta) {
  auto num = [](double v) -> ojson { return v >= 0 && std::isfinite(v) ? ojson(v) : ojson(); };
  ojson doc;
  doc["device"] = meta.device;
  doc["device_uuid"] = meta.device_uuid;
  doc["commit"] = meta.commit;
  doc["date"] = meta.date;
  doc["workloads"] = meta.workloads;
  doc["options"] = meta.options;
  doc["knobs"] = meta.knobs;
  doc["ceilings"] = {{"read_tbps", meta.ceilings.read_tbps},
                     {"bf16_tflops", meta.ceilings.bf16_tflops},
                     {"fp8_tflops", meta.ceilings.fp8_tflops},
                     {"source", meta.ceilings.source}};
  doc["launch_floor_ms"] = num(meta.launch_floor_ms);
  doc["launch_floor_grid_ms"] = num(meta.launch_floor_grid_ms);
  doc["launch_floor_grid_blocks"] = meta.launch_floor_grid_blocks;
  ojson recs = ojson::array();
  for (const RowResult& r : rows) {
    ojson j;
    j["op"] = r.op;
    j["workload"] = r.workload;
    j["base_workload"] = r.base_workload;
    j["tokens"] = r.tokens >= 0 ? ojson(r.tokens) : ojson();
    j["dtype"] = r.dtype;
    j["status"] = r.status;
    j["ours_ms"] = num(r.ours_ms);
    ojson alts = ojson::object(), alt_notes = ojson::object();
    for (const AltTime& a : r.alternatives) {
      alts[a.name] = num(a.ms);
      if (!a.note.empty()) alt_notes[a.name] = a.note;
    }
    j["alternatives"] = alts;
    if (!alt_notes.empty()) j["alternative_notes"] = alt_notes;
    j["best_alternative"] = r.best_alt_name().empty() ? ojson() : ojson(r.best_alt_name());
    j["ratio"] = num(r.ratio());
    j["page_ms"] = num(r.page_ms);
    j["ours_over_page"] = (r.page_ms > 0 && r.ours_ms > 0) ? ojson(r.ours_ms / r.page_ms) : ojson();
    j["flops"] = r.cost.flops;
    j["bytes"] = r.cost.bytes;
    j["tflops"] =
        (r.cost.flops > 0 && r.ours_ms > 0) ? ojson(r.cost.flops / r.ours_ms / 1e9) : ojson();
    j["ideal_ms"] = r.sol.ideal_ms;
    j["sol"] = r.ours_ms > 0 ? ojson(r.sol.sol) : ojson();
    j["bound"] = r.sol.bound;
    j["active_experts"] = r.active_experts >= 0 ? ojson(r.active_experts) : ojson();
    j["num_experts"] = r.num_experts > 0 ? ojson(r.num_experts) : ojson();
    j["routed_rows"] = r.routed_rows >= 0 ? ojson(r.routed_rows) : ojson();
    j["rel_l2"] = r.checked ? num(r.rel_l2) : ojson();
    j["err_ratio"] = r.checked ? num(r.err_ratio) : ojson();
    j["accuracy"] = r.checked ? (r.acc_pass ? "pass" : "fail") : "unchecked";
    j["reference"] = r.reference;
    j["timing"] = r.timing;
    j["counts"] = r.counts;
    j["plan"] = r.plan;
    if (r.forced_candidate >= 0) j["forced_candidate"] = r.forced_candidate;
    if (!r.candidates.empty()) {
      ojson cands = ojson::array();
      for (const CandidateTime& c : r.candidates)
        cands.push_back(
            {{"index", c.index},
             {"plan", c.plan},
             {"ms", num(c.ms)},
             {"over_default", (c.ms > 0 && r.ours_ms > 0) ? ojson(c.ms / r.ours_ms) : ojson()},
             {"accuracy", c.checked ? (c.acc_pass ? "pass" : "fail") : "unchecked"},
             {"rel_l2", c.checked ? num(c.rel_l2) : ojson()},
             {"err_ratio", c.checked ? num(c.err_ratio) : ojson()},
             {"note", c.note}});
      j["candidates"] = cands;
    }
    j["notes"] = r.notes;
    recs.push_back(std::move(j));
  }
  doc["records"] = recs;
  return doc.dump(1) + "\n";
}

int merge_extra_alternatives(std::vector<RowResult>& rows, const std::string& json_text,
                             std::vector<std::string>* unmatched) {
  ojson doc;
  try {
    doc = ojson::parse(json_text);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--extra-alternatives: not valid JSON: ") + e.what());
  }
  const ojson* recs = &doc;
  if (doc.is_object()) {
    if (!doc.contains("records") || !doc["records"].is_array())
      throw std::runtime_error("--extra-alternatives: expected {\"records\": [...]} or an array");
    recs = &doc["records"];
  } else if (!doc.is_array()) {
    throw std::runtime_error("--extra-alternatives: expected {\"records\": [...]} or an array");
  }
  int merged = 0;
  for (const ojson& rec : *recs) {
    if (!rec.is_object() || !rec.contains("op") || !rec.contains("workload") ||
        !rec.contains("dtype"))
      throw std::runtime_error("--extra-alternatives: a record lacks op, workload or dtype: " +
                               rec.dump());
    std::string op = rec["op"].get<std::string>(), wl = rec["workload"].get<std::string>(),
                dt = rec["dtype"].get<std::string>();
    std::map<std::string, double> times;
    if (rec.contains("alternatives") && rec["alternatives"].is_object()) {
      for (auto it = rec["alternatives"].begin(); it != rec["alternatives"].end(); ++it)
        if (it.value().is_number()) times[it.key()] = it.value().get<double>();
    } else if (rec.contains("name") && rec.contains("ms") && rec["ms"].is_number()) {
      times[rec["name"].get<std::string>()] = rec["ms"].get<double>();
    } else {
      throw std::runtime_error(
          "--extra-alternatives: a record has neither alternatives nor "
          "name/ms: " +
          rec.dump());
    }
    RowResult* target = nullptr;
    for (RowResult& r : rows)
      if (r.op == op && r.workload == wl && r.dtype == dt) target = &r;
    if (!target) {
      if (unmatched) unmatched->push_back(op + " " + wl + " " + dt);
      continue;
    }
    for (const auto& [name, ms] : times) {
      if (!(ms > 0)) continue;
      AltTime a;
      a.name = name;
      a.ms = ms;
      a.external = true;
      for (const AltTime& existing : target->alternatives)
        if (existing.name == name && !existing.external) a.name = name + "-ext";
      bool replaced = false;
      for (AltTime& existing : target->alternatives)
        if (existing.external && existing.name == a.name) {
          existing = a;
          replaced = true;
        }
      if (!replaced) target->alternatives.push_back(a);
      ++merged;
    }
  }
  return merged;
}

}  // namespace moekit::bench
