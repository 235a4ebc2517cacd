// The benchmark's workload list: the schema of workloads/seed1.json (ops, each with
// workloads whose tensor shapes and params are strings), expanded into rows (one per
// workload and dtype), filtered, and re-shaped for other token counts (--tokens).
// Host code only: the CPU tests cover all of it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace moekit::bench {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // as listed ("f32", "i32"); empty = the row's dtype
};

// The page's own figures for one dtype of a workload (all optional in user files).
struct PageResult {
  double ours_ms = -1;  // < 0: absent
  std::map<std::string, double> alternatives_ms;
  double tflops = -1;
  double sol_pct = -1;
  std::string bound;
};

struct Workload {
  std::string op;
  std::string name;
  std::vector<TensorSpec> tensors;  // in the file's order
  std::map<std::string, std::string> params;
  std::vector<std::string> dtypes;
  std::map<std::string, PageResult> results;  // by dtype

  const TensorSpec* tensor(const std::string& name) const;
  bool has_param(const std::string& key) const { return params.count(key) != 0; }
  std::string param(const std::string& key, const std::string& fallback = "") const;
  int64_t int_param(const std::string& key, int64_t fallback) const;
  double float_param(const std::string& key, double fallback) const;
  bool bool_param(const std::string& key, bool fallback) const;
};

// One table row: a workload at one dtype (and, with --tokens, one token count).
struct Row {
  Workload w;                      // shapes already scaled when tokens >= 0
  std::string dtype;               // "bf16", "f16", "f32", "i32", "fp8e4m3", or "in/out"
  int64_t tokens = -1;             // the --tokens count this row was re-shaped to, or -1
  std::optional<PageResult> page;  // the page's figures (unscaled rows only)

  std::string display_name() const;  // "name" or "name@T=16"
  std::string in_dtype() const;      // "bf16/f32" -> "bf16"
  std::string out_dtype() const;     // "bf16/f32" -> "f32", "bf16" -> "bf16"
};

// Parses an integer shape expression: digits, + - * /, parentheses (e.g. "2 * 2048").
// Throws std::invalid_argument naming the expression on anything else.
int64_t eval_dim(const std::string& expr);

// Parses a workload file (the schema of seed1.json). Throws std::runtime_error with
// the offending op/workload named when the file does not fit the schema.
std::vector<Workload> parse_workloads(const std::string& json_text);
// The project's own copy of the seed list, compiled into the binary.
const std::string& builtin_workloads_json();

// All rows of the workloads, in file order (workload, then its dtypes).
std::vector<Row> expand_rows(const std::vector<Workload>& workloads);

// Substring filters: each is a comma-separated list; a row passes when, for every
// non-empty filter, one of its entries is a substring of the row's field.
struct Filters {
  std::string op, workload, dtype;
};
bool row_matches(const Row& row, const Filters& filters);

// --quick: a small representative subset (about two rows per op).
std::vector<Row> quick_subset(const std::vector<Row>& rows);

// --tokens "1-16,31,33" -> {1..16, 31, 33} (order kept, duplicates dropped).
// Throws std::invalid_argument on malformed lists, zero, or reversed ranges.
std::vector<int64_t> parse_token_list(const std::string& text);

// Valid rows of a masked layout: the workload's T param, else 3/4 of E*max_m (what
// the page's own FLOP figure for ds-v3-ep8-masked implies: 96 of 128 rows per expert).
int64_t masked_total_rows(const Workload& w);

// The token count a workload is shaped by (T for token-shaped tensors; the routed
// row count P for ops that take a permuted buffer; the masked T param), or -1.
int64_t token_count(const Workload& w);
// The workload re-shaped to `tokens` (T and every T-derived shape), or nullopt
// when the workload has no token dimension.
std::optional<Workload> with_tokens(const Workload& w, int64_t tokens);
// Rows for every listed token count of every token-shaped workload.
std::vector<Row> expand_token_rows(const std::vector<Workload>& workloads,
                                   const std::vector<int64_t>& tokens);

// Element size of a dtype name ("bf16" -> 2); 0 for an unknown name.
size_t dtype_bytes(const std::string& dtype);

}  // namespace moekit::bench
