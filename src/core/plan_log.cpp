#include "core/plan_log.h"

#include <cstdlib>

namespace moekit::detail {

bool plan_log_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOEKIT_LOG_PLANS");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on;
}

std::string plan_log_line(const char* op, const std::string& shape_key, const std::string& plan) {
  return std::string("moekit plan: ") + op + " " + shape_key + " -> " + plan + "\n";
}

bool PlanLog::log(const char* op, const std::string& shape_key, const std::string& plan) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!seen_.emplace(op, shape_key).second) return false;
  // One write per line, under the lock: lines of concurrent callers never interleave.
  const std::string line = plan_log_line(op, shape_key, plan);
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
  return true;
}

void log_plan(const char* op, const std::string& shape_key, const std::string& plan) {
  if (!plan_log_enabled()) return;
  static PlanLog log(stderr);
  log.log(op, shape_key, plan);
}

}  // namespace moekit::detail
