// moekit reports bad input by throwing moekit::Error before anything is launched.
#pragma once

#include <stdexcept>
#include <string>

namespace moekit {

// Thrown for invalid arguments (message: "<op>: <argument>: expected ..., got ...")
// and for CUDA errors seen on the host side of a launch.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace moekit
