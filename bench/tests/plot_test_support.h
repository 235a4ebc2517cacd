// What the pictures' CPU tests share.
#pragma once

#include <string>

namespace moekit::bench {

// How often `what` occurs in `text` (panels, series, tooltips of an SVG).
inline size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace moekit::bench
