// The tuning tables' registry (include/moekit/tuning.h): the built-in tables, parsed once on
// first use, and the loaded ones; the layer ops' lookup. Thread-safe: a mutex guards the
// loaded tables, and a lookup with no table at all costs one atomic load.

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>

#include "moe/tuning_table.h"
#include "moekit/error.h"

namespace moekit {
namespace detail {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::vector<ParsedEntry>> loaded;  // last loaded last
  std::atomic<bool> any_loaded{false};
};

Registry& registry() {
  static Registry r;
  return r;
}

// Built-in tables are checked by the tests (every entry parses and names a candidate); one
// that does not parse here is left out rather than failing every layer call.
const std::vector<ParsedEntry>& builtin_entries() {
  static const std::vector<ParsedEntry> entries = [] {
    std::vector<ParsedEntry> all;
    for (const BuiltinTable& t : builtin_tuning_tables()) {
      try {
        for (ParsedEntry& e : parse_tuning_table(t.text, t.name, nullptr)) all.push_back(e);
      } catch (const Error&) {
      }
    }
    return all;
  }();
  return entries;
}

const ParsedEntry* find_entry(const std::vector<ParsedEntry>& entries, const std::string& device,
                              const TuningShape& shape, const LayerProblem& problem,
                              const GemmDevice& gemm) {
  for (const ParsedEntry& e : entries) {
    if (e.entry.device != device || !(e.entry.shape == shape) || !serves(e.entry, problem.s.T))
      continue;
    if (layer_plan_rejection(e.plan, problem, gemm).empty()) return &e;
  }
  return nullptr;
}

TuningDevice current_tuning_device() {
  return {device_name(), current_gemm_device()};
}

}  // namespace

void add_tuning_table(std::vector<ParsedEntry> entries) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.loaded.push_back(std::move(entries));
  r.any_loaded = true;
}

bool tuning_tables_present() {
  return registry().any_loaded.load(std::memory_order_acquire) || !builtin_entries().empty();
}

bool tuned_layer_plan(const std::string& device_name, const TuningShape& shape, int64_t T,
                      const GemmDevice& device, LayerPlan* out, const LayerProblem* actual) {
  const LayerProblem problem = actual != nullptr ? *actual : tuning_problem(shape, T);
  Registry& r = registry();
  if (r.any_loaded.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (auto t = r.loaded.rbegin(); t != r.loaded.rend(); ++t) {
      if (const ParsedEntry* e = find_entry(*t, device_name, shape, problem, device)) {
        *out = e->plan;
        return true;
      }
    }
  }
  if (const ParsedEntry* e = find_entry(builtin_entries(), device_name, shape, problem, device)) {
    *out = e->plan;
    return true;
  }
  return false;
}

}  // namespace detail

void load_tuning_table_text(const std::string& text, const std::string& name) {
  const detail::TuningDevice device = detail::current_tuning_device();
  detail::add_tuning_table(detail::parse_tuning_table(text, name, &device));
}

void load_tuning_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the tuning table");
  std::ostringstream text;
  text << in.rdbuf();
  load_tuning_table_text(text.str(), path);
}

void clear_tuning_tables() {
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.loaded.clear();
  r.any_loaded = false;
}

std::vector<TuningEntry> tuning_entries() {
  std::vector<TuningEntry> out;
  {
    detail::Registry& r = detail::registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (auto t = r.loaded.rbegin(); t != r.loaded.rend(); ++t)
      for (const detail::ParsedEntry& e : *t) out.push_back(e.entry);
  }
  for (const detail::ParsedEntry& e : detail::builtin_entries()) out.push_back(e.entry);
  return out;
}

}  // namespace moekit
