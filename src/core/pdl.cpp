#include "core/pdl.h"

#include <cstdlib>

namespace moekit::detail {

int& pdl_override() {
  static int v = 0;
  return v;
}

bool pdl_enabled() {
  static const bool env_on = [] {
    const char* v = std::getenv("MOEKIT_PDL");
    return !(v != nullptr && v[0] == '0');
  }();
  const int o = pdl_override();
  return o == 0 ? env_on : o == 1;
}

}  // namespace moekit::detail
