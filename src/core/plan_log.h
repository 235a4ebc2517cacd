// The plan log: with MOEKIT_LOG_PLANS=1 in the environment, each op prints the plan it
// runs once per distinct shape to stderr, one line
//   moekit plan: <op> <shape key> -> <plan>
// so a user can see which kernels run for their shapes (docs/settings.md).
#pragma once

#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace moekit::detail {

// True when MOEKIT_LOG_PLANS is set to anything but empty or "0" (read once). Callers
// test it before building the plan's string.
bool plan_log_enabled();

// Prints the op's plan for this shape key unless this (op, shape_key) pair was printed
// before. A no-op when the log is off. Thread-safe.
void log_plan(const char* op, const std::string& shape_key, const std::string& plan);

// The log's state, separate from the environment for tests: remembers the printed
// (op, shape_key) pairs and writes each new one's line to `out`.
class PlanLog {
 public:
  explicit PlanLog(std::FILE* out) : out_(out) {}
  // Returns whether it printed (the first time this pair is seen).
  bool log(const char* op, const std::string& shape_key, const std::string& plan);

 private:
  std::FILE* out_;
  std::mutex mu_;
  std::set<std::pair<std::string, std::string>> seen_;
};

// The line log() prints for a pair, newline included.
std::string plan_log_line(const char* op, const std::string& shape_key, const std::string& plan);

}  // namespace moekit::detail
