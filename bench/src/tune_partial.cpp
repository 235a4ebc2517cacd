#include "tune_partial.h"

#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace moekit::tune {

const char* const kPartialHeaderPrefix = "# moekit-tune partial: ";

std::string format_measurement(const Measurement& m) {
  char us[32];
  std::snprintf(us, sizeof us, "%.4f", m.us);
  return std::to_string(m.tokens) + " | " + m.routing + " | " + m.plan + " | " + us + " | " +
         (m.accurate ? "accurate" : "inaccurate") + " | " + (m.is_default ? "default" : "-");
}

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> f;
  std::stringstream in(line);
  std::string field;
  while (std::getline(in, field, '|')) {
    const size_t b = field.find_first_not_of(" \t"), e = field.find_last_not_of(" \t\r");
    f.push_back(b == std::string::npos ? "" : field.substr(b, e - b + 1));
  }
  return f;
}

bool parse_measurement(const std::string& line, Measurement* m, std::string* why) {
  const std::vector<std::string> f = split_fields(line);
  if (f.size() != 6) {
    *why = "expected 6 '|'-separated fields, got " + std::to_string(f.size());
    return false;
  }
  size_t used = 0;
  try {
    m->tokens = std::stoll(f[0], &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != f[0].size() || m->tokens < 1) {
    *why = "tokens: expected an integer >= 1, got '" + f[0] + "'";
    return false;
  }
  try {
    m->us = std::stod(f[3], &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != f[3].size()) {
    *why = "us: expected a number, got '" + f[3] + "'";
    return false;
  }
  m->routing = f[1];
  m->plan = f[2];
  if ((f[4] != "accurate" && f[4] != "inaccurate") || (f[5] != "default" && f[5] != "-") ||
      (m->routing != "uniform" && m->routing != "skewed") || m->plan.empty()) {
    *why = "expected 'T | uniform/skewed | plan | us | accurate/inaccurate | default/-'";
    return false;
  }
  m->accurate = f[4] == "accurate";
  m->is_default = f[5] == "default";
  return true;
}

}  // namespace moekit::tune
