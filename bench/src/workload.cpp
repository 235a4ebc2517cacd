#include "workload.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace moekit::bench {

using ojson = nlohmann::ordered_json;

const TensorSpec* Workload::tensor(const std::string& tname) const {
  for (const TensorSpec& t : tensors)
    if (t.name == tname) return &t;
  return nullptr;
}

std::string Workload::param(const std::string& key, const std::string& fallback) const {
  auto it = params.find(key);
  return it == params.end() ? fallback : it->second;
}

int64_t Workload::int_param(const std::string& key, int64_t fallback) const {
  auto it = params.find(key);
  return it == params.end() ? fallback : eval_dim(it->second);
}

double Workload::float_param(const std::string& key, double fallback) const {
  auto it = params.find(key);
  if (it == params.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0')
    throw std::invalid_argument(op + "/" + name + ": param '" + key + "' is not a number: '" +
                                it->second + "'");
  return v;
}

bool Workload::bool_param(const std::string& key, bool fallback) const {
  auto it = params.find(key);
  if (it == params.end()) return fallback;
  if (it->second == "true" || it->second == "1") return true;
  if (it->second == "false" || it->second == "0") return false;
  throw std::invalid_argument(op + "/" + name + ": param '" + key + "' is not a boolean: '" +
                              it->second + "'");
}

std::string Row::display_name() const {
  return tokens >= 0 ? w.name + "@T=" + std::to_string(tokens) : w.name;
}

std::string Row::in_dtype() const {
  size_t slash = dtype.find('/');
  return slash == std::string::npos ? dtype : dtype.substr(0, slash);
}

std::string Row::out_dtype() const {
  size_t slash = dtype.find('/');
  return slash == std::string::npos ? dtype : dtype.substr(slash + 1);
}

// ---- shape expressions -------------------------------------------------------------

namespace {

struct ExprParser {
  const std::string& s;
  size_t i = 0;

  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument("shape expression '" + s + "': " + why);
  }
  void skip() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  int64_t primary() {
    skip();
    if (i < s.size() && s[i] == '(') {
      ++i;
      int64_t v = sum();
      skip();
      if (i >= s.size() || s[i] != ')') fail("missing ')'");
      ++i;
      return v;
    }
    if (i < s.size() && s[i] == '-') {
      ++i;
      return -primary();
    }
    size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (start == i) fail("expected a number at position " + std::to_string(start));
    return std::stoll(s.substr(start, i - start));
  }
  int64_t product() {
    int64_t v = primary();
    for (;;) {
      skip();
      if (i < s.size() && s[i] == '*') {
        ++i;
        v *= primary();
      } else if (i < s.size() && s[i] == '/') {
        ++i;
        int64_t d = primary();
        if (d == 0) fail("division by zero");
        v /= d;
      } else {
        return v;
      }
    }
  }
  int64_t sum() {
    int64_t v = product();
    for (;;) {
      skip();
      if (i < s.size() && s[i] == '+') {
        ++i;
        v += product();
      } else if (i < s.size() && s[i] == '-') {
        ++i;
        v -= product();
      } else {
        return v;
      }
    }
  }
};

std::string scalar_string(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) {
    std::string s = v.dump();
    return s;
  }
  throw std::runtime_error("expected a string or number, got " + v.dump());
}

bool is_masked(const Workload& w) {
  if (w.param("layout").rfind("masked", 0) == 0) return true;
  const TensorSpec* a = w.tensor("a");
  return a && a->shape.size() == 3;
}

}  // namespace

int64_t eval_dim(const std::string& expr) {
  ExprParser p{expr};
  int64_t v = p.sum();
  p.skip();
  if (p.i != expr.size()) p.fail("unexpected '" + expr.substr(p.i) + "'");
  return v;
}

// ---- parsing -------------------------------------------------------------------------

std::vector<Workload> parse_workloads(const std::string& json_text) {
  ojson doc;
  try {
    doc = ojson::parse(json_text);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("workload file is not valid JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("ops") || !doc["ops"].is_array())
    throw std::runtime_error("workload file: expected an object with an \"ops\" array");
  std::vector<Workload> out;
  for (const ojson& op : doc["ops"]) {
    if (!op.contains("op") || !op["op"].is_string())
      throw std::runtime_error("workload file: an entry of \"ops\" has no \"op\" name");
    std::string op_name = op["op"].get<std::string>();
    if (!op.contains("workloads") || !op["workloads"].is_array())
      throw std::runtime_error("workload file: op " + op_name + " has no \"workloads\" array");
    for (const ojson& wj : op["workloads"]) {
      Workload w;
      w.op = op_name;
      if (!wj.contains("name") || !wj["name"].is_string())
        throw std::runtime_error("workload file: a workload of " + op_name + " has no name");
      w.name = wj["name"].get<std::string>();
      std::string where = op_name + "/" + w.name;
      try {
        if (!wj.contains("tensors") || !wj["tensors"].is_object())
          throw std::runtime_error("no \"tensors\" object");
        for (auto it = wj["tensors"].begin(); it != wj["tensors"].end(); ++it) {
          TensorSpec t;
          t.name = it.key();
          const ojson& tj = it.value();
          if (!tj.contains("shape") || !tj["shape"].is_array())
            throw std::runtime_error("tensor '" + t.name + "' has no shape array");
          for (const ojson& d : tj["shape"]) {
            int64_t v = d.is_number_integer() ? d.get<int64_t>() : eval_dim(scalar_string(d));
            if (v < 0) throw std::runtime_error("tensor '" + t.name + "' has a negative dim");
            t.shape.push_back(v);
          }
          if (tj.contains("dtype")) t.dtype = tj["dtype"].get<std::string>();
          w.tensors.push_back(std::move(t));
        }
        if (wj.contains("params")) {
          for (auto it = wj["params"].begin(); it != wj["params"].end(); ++it)
            w.params[it.key()] = scalar_string(it.value());
        }
        if (!wj.contains("dtypes") || !wj["dtypes"].is_array() || wj["dtypes"].empty())
          throw std::runtime_error("no \"dtypes\" list");
        for (const ojson& d : wj["dtypes"]) w.dtypes.push_back(d.get<std::string>());
        if (wj.contains("results") && wj["results"].is_object()) {
          for (auto it = wj["results"].begin(); it != wj["results"].end(); ++it) {
            const ojson& rj = it.value();
            PageResult r;
            if (rj.contains("seed_ours_ms") && rj["seed_ours_ms"].is_number())
              r.ours_ms = rj["seed_ours_ms"].get<double>();
            if (rj.contains("alternatives_ms") && rj["alternatives_ms"].is_object())
              for (auto a = rj["alternatives_ms"].begin(); a != rj["alternatives_ms"].end(); ++a)
                if (a.value().is_number()) r.alternatives_ms[a.key()] = a.value().get<double>();
            if (rj.contains("tflops") && rj["tflops"].is_number())
              r.tflops = rj["tflops"].get<double>();
            if (rj.contains("sol_pct") && rj["sol_pct"].is_number())
              r.sol_pct = rj["sol_pct"].get<double>();
            if (rj.contains("bound") && rj["bound"].is_string())
              r.bound = rj["bound"].get<std::string>();
            w.results[it.key()] = r;
          }
        }
      } catch (const std::exception& e) {
        throw std::runtime_error("workload file: " + where + ": " + e.what());
      }
      out.push_back(std::move(w));
    }
  }
  return out;
}

std::vector<Row> expand_rows(const std::vector<Workload>& workloads) {
  std::vector<Row> rows;
  for (const Workload& w : workloads) {
    for (const std::string& dt : w.dtypes) {
      Row r;
      r.w = w;
      r.dtype = dt;
      auto it = w.results.find(dt);
      if (it != w.results.end()) r.page = it->second;
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

// ---- filters ---------------------------------------------------------------------------

namespace {

bool any_substring(const std::string& field, const std::string& list) {
  if (list.empty()) return true;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    std::string item =
        list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty() && field.find(item) != std::string::npos) return true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return false;
}

}  // namespace

bool row_matches(const Row& row, const Filters& f) {
  return any_substring(row.w.op, f.op) && any_substring(row.display_name(), f.workload) &&
         any_substring(row.dtype, f.dtype);
}

std::vector<Row> quick_subset(const std::vector<Row>& rows) {
  // Two rows per seed op, chosen to cover decode and prefill-ish sizes, both
  // dtypes and both layouts while keeping the run short; ops not named here (user
  // files) contribute their first row.
  static const std::set<std::string> picks = {
      "FusedMoEFwd|qwen3-30b-decode-b32|bf16",
      "FusedMoEFwd|qwen3-235b-decode|f16",
      "FusedMoESharedExpertFwd|glm45-t32|bf16",
      "FusedMoESharedExpertFwd|kimi-k2-t1|bf16",
      "FusedTopKFwd|qwen3-235b-t512|bf16",
      "FusedTopKFwd|ds-v3-grouped-t64|f32",
      "MoEPrePermuteFwd|ds-v3-ep8-t100|bf16",
      "MoEPrePermuteFwd|decode-t32|f16",
      "MoEPermuteAlignFwd|ds-v3-t4096|i32",
      "MoEPermuteAlignFwd|qwen3-235b-t32|i32",
      "MoEPostPermuteFwd|ds-v3-ep8-t100|bf16",
      "MoEPostPermuteFwd|decode-t32|bf16/bf16",
      "MoEGroupedGemmFwd|ds-v3-decode-mlp-up|bf16",
      "MoEGroupedGemmFwd|qwen3-30b-ep8-routed256|bf16",
      "MoEGroupedGemmFwd|ds-v3-ep8-masked|bf16",
      "MoEGroupedGemmFP8Fwd|qwen3-235b-dec-b64-up|fp8e4m3",
      "MoEGroupedGemmFP8Fwd|ds-v3-e8-up-masked|fp8e4m3",
      "MoEExpertMLPFwd|qwen3-235b-decode|bf16",
      "FusedMoEExpertsFwd|qwen3-235b-decode|bf16",
      "IndexedExpertMLPFwd|ds-v3-t1|bf16",
      "IndexedExpertMLPFwd|qwen3-235b-t32|bf16",
      "SharedExpertMLPFwd|ds-v3-t32|bf16",
      "SharedExpertMLPFwd|kimi-k2-t512|bf16",
  };
  std::vector<Row> out;
  std::set<std::string> ops_seen, ops_picked;
  for (const Row& r : rows)
    if (picks.count(r.w.op + "|" + r.w.name + "|" + r.dtype)) ops_picked.insert(r.w.op);
  for (const Row& r : rows) {
    bool first_of_op = ops_seen.insert(r.w.op).second;
    if (picks.count(r.w.op + "|" + r.w.name + "|" + r.dtype) ||
        (first_of_op && !ops_picked.count(r.w.op)))
      out.push_back(r);
  }
  return out;
}

// ---- token counts ----------------------------------------------------------------------

std::vector<int64_t> parse_token_list(const std::string& text) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  auto number = [&](const std::string& s) -> int64_t {
    if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(c); }))
      throw std::invalid_argument("--tokens: '" + s + "' is not a positive integer (in '" + text +
                                  "')");
    int64_t v = std::stoll(s);
    if (v <= 0) throw std::invalid_argument("--tokens: counts must be >= 1 (in '" + text + "')");
    return v;
  };
  size_t pos = 0;
  if (text.empty()) throw std::invalid_argument("--tokens: empty list");
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t dash = item.find('-');
    int64_t lo, hi;
    if (dash == std::string::npos) {
      lo = hi = number(item);
    } else {
      lo = number(item.substr(0, dash));
      hi = number(item.substr(dash + 1));
      if (hi < lo) throw std::invalid_argument("--tokens: range '" + item + "' runs backwards");
      if (hi - lo > 65536) throw std::invalid_argument("--tokens: range '" + item + "' too long");
    }
    for (int64_t v = lo; v <= hi; ++v)
      if (seen.insert(v).second) out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

int64_t masked_total_rows(const Workload& w) {
  if (w.has_param("T")) return w.int_param("T", 0);
  const TensorSpec* a = w.tensor("a");
  if (!a || a->shape.size() != 3) return -1;
  return a->shape[0] * a->shape[1] * 3 / 4;
}

namespace {

const char* const kTokenTensors[] = {"hidden_states", "gating_output", "topk_ids",
                                     "topk_weights",  "output",        "local_expert_ids"};

int64_t route_width(const Workload& w) {
  for (const char* n : {"topk_ids", "local_expert_ids", "topk_weights"}) {
    const TensorSpec* t = w.tensor(n);
    if (t && t->shape.size() == 2) return t->shape[1];
  }
  return w.int_param("top_k", 1);
}

}  // namespace

int64_t token_count(const Workload& w) {
  if (w.op == "MoEGroupedGemmFP8Fwd" || (w.op == "MoEGroupedGemmFwd" && is_masked(w)))
    return masked_total_rows(w);
  if (w.op == "MoEGroupedGemmFwd") {
    const TensorSpec* a = w.tensor("a");
    return a && !a->shape.empty() ? a->shape[0] : -1;
  }
  if (w.op == "MoEExpertMLPFwd") {
    const TensorSpec* x = w.tensor("expert_input");
    return x && !x->shape.empty() ? x->shape[0] : -1;
  }
  for (const char* n : kTokenTensors) {
    const TensorSpec* t = w.tensor(n);
    if (t && !t->shape.empty()) return t->shape[0];
  }
  return -1;
}

std::optional<Workload> with_tokens(const Workload& w, int64_t tokens) {
  int64_t t0 = token_count(w);
  if (t0 < 0 || tokens <= 0) return std::nullopt;
  Workload out = w;
  if (tokens != t0) out.results.clear();  // the page's figures are for its own shapes
  bool masked = w.op == "MoEGroupedGemmFP8Fwd" || (w.op == "MoEGroupedGemmFwd" && is_masked(w));
  if (masked) {
    out.params["T"] = std::to_string(tokens);
    return out;
  }
  int64_t k = route_width(w);
  for (TensorSpec& t : out.tensors) {
    if (t.shape.empty()) continue;
    bool token_tensor =
        std::find_if(std::begin(kTokenTensors), std::end(kTokenTensors),
                     [&](const char* n) { return t.name == n; }) != std::end(kTokenTensors);
    if (token_tensor) {
      t.shape[0] = tokens;
    } else if (w.op == "MoEPostPermuteFwd" &&
               (t.name == "inverse_indices" || t.name == "expert_output")) {
      t.shape[0] = tokens * k;
    } else if ((w.op == "MoEGroupedGemmFwd" && t.name == "a") ||
               (w.op == "MoEExpertMLPFwd" && t.name == "expert_input")) {
      t.shape[0] = tokens;
    }
  }
  return out;
}

std::vector<Row> expand_token_rows(const std::vector<Workload>& workloads,
                                   const std::vector<int64_t>& tokens) {
  std::vector<Row> rows;
  for (const Workload& w : workloads) {
    for (int64_t n : tokens) {
      std::optional<Workload> scaled = with_tokens(w, n);
      if (!scaled) continue;
      for (const std::string& dt : scaled->dtypes) {
        Row r;
        r.w = *scaled;
        r.dtype = dt;
        r.tokens = n;
        auto it = scaled->results.find(dt);
        if (it != scaled->results.end()) r.page = it->second;
        rows.push_back(std::move(r));
      }
    }
  }
  return rows;
}

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "f16") return 2;
  if (dtype == "f32" || dtype == "i32") return 4;
  if (dtype == "fp8e4m3") return 1;
  return 0;
}

}  // namespace moekit::bench
