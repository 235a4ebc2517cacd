// Results of a benchmark run and their renderings: the plain table (stdout), markdown,
// JSON, and the merge of externally measured alternatives. Host code only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace moekit::bench {

struct AltTime {
  std::string name;
  double ms = -1;         // < 0: not timed (see note)
  std::string note;       // why it was not timed, or a caveat
  bool external = false;  // merged from --extra-alternatives
};

// One plan candidate of a row (--candidates): timed in the row's rounds, checked.
struct CandidateTime {
  int index = 0;
  std::string plan;  // to_string of the plan
  double ms = -1;    // < 0: not timed (see note)
  bool checked = false, acc_pass = false;
  double rel_l2 = -1, err_ratio = -1;
  std::string note;
};

struct RowResult {
  std::string op, workload, base_workload, dtype;
  int64_t tokens = -1;
  std::string status = "ok";  // "ok", or why the row was not measured
  double ours_ms = -1;
  std::vector<AltTime> alternatives;
  double page_ms = -1;
  Cost cost;
  Sol sol;
  int64_t active_experts = -1, num_experts = 0, routed_rows = -1;
  bool checked = false, acc_pass = false;
  double rel_l2 = -1, err_ratio = -1;
  std::string reference;      // "cpu-f64", "gpu-f32 (256 of 4096 rows)", ...
  std::string timing;         // "graph x512 rot 8", "flush", "plain"
  std::string counts;         // "equal", "random", "routed" (permuted-layout / routed ops)
  std::string plan = "-";     // the plan moekit ran (moekit/plan.h to_string); "-": no planner
  int forced_candidate = -1;  // --candidate I: the plan is candidate I
  std::vector<CandidateTime> candidates;  // --candidates
  std::vector<std::string> notes;

  // The fastest timed alternative (-1 / "" when none).
  double best_alt_ms() const;
  std::string best_alt_name() const;
  double ratio() const;  // best alternative / ours (-1 when either is missing)
};

struct RunMeta {
  std::string device, device_uuid, commit, date, workloads;
  Ceilings ceilings;
  std::string options;  // the command line, for the record
  // The MOEKIT_* environment variables set for the run ("NAME=value", sorted): the
  // library's tuning knobs change what is measured, so a saved run names them.
  std::vector<std::string> knobs;
  // Launch floor: an empty kernel timed like the latency-bound rows (graph of
  // back-to-back calls), per call; < 0 when not measured.
  double launch_floor_ms = -1;       // 1 block of 32 threads
  double launch_floor_grid_ms = -1;  // one 1024-thread block per SM
  int launch_floor_grid_blocks = 0;
};

// The MOEKIT_* entries of a NULL-terminated environment block, sorted.
std::vector<std::string> moekit_knobs(const char* const* envp);
// "knobs: A=1 B=2" or "knobs: none (library defaults)" (table and markdown header).
std::string knobs_line(const RunMeta& m);

// "launch floor: ..." (the header line of the table and the markdown).
std::string launch_floor_line(const RunMeta& m);

std::string format_ms(double ms);  // 4 significant digits, no exponent; "-" when < 0

// The short form of a plan line for the plain table: "gate_up: " / "down: " dropped, the two
// GEMMs of an MLP shown once when equal ("chain{sm90_pairs 128x256 dyn}"), "dynamic" as "dyn".
std::string compact_plan(const std::string& plan);

std::string render_table(const std::vector<RowResult>& rows, const RunMeta& meta);
std::string render_markdown(const std::vector<RowResult>& rows, const RunMeta& meta);
std::string render_json(const std::vector<RowResult>& rows, const RunMeta& meta);

// Merges externally measured times into the rows, by (op, workload, dtype). The file is
// either {"records": [...]} (the shape of --json output) or a plain array; each record
// has op, workload, dtype and either "alternatives": {name: ms} or "name" and "ms".
// Returns the number of times merged; `unmatched` gets the records that matched no row.
int merge_extra_alternatives(std::vector<RowResult>& rows, const std::string& json_text,
                             std::vector<std::string>* unmatched = nullptr);

}  // namespace moekit::bench
