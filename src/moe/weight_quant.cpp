// The weight-quantization vocabulary (include/moekit/quant.h).
#include "moe/weight_quant.h"

#include <cstring>

namespace moekit {

namespace {
constexpr QuantScheme kSchemes[] = {QuantScheme::kNone, QuantScheme::kFp8PerTensor,
                                    QuantScheme::kFp8PerChannel, QuantScheme::kFp8Block128};
}  // namespace

const char* quant_scheme_name(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::kNone:
      return "none";
    case QuantScheme::kFp8PerTensor:
      return "fp8_per_tensor";
    case QuantScheme::kFp8PerChannel:
      return "fp8_per_channel";
    case QuantScheme::kFp8Block128:
      return "fp8_block128";
  }
  return "unknown";
}

namespace detail {
bool is_quant_scheme(QuantScheme q) {
  for (QuantScheme s : kSchemes) {
    if (q == s) return true;
  }
  return false;
}
}  // namespace detail

bool parse_quant_scheme(const std::string& text, QuantScheme* out) {
  for (QuantScheme s : kSchemes) {
    if (text == quant_scheme_name(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

std::vector<int64_t> weight_scale_shape(QuantScheme scheme, int64_t E, int64_t rows, int64_t cols,
                                        bool experts) {
  if (!detail::is_quant_scheme(scheme)) {
    throw Error("moekit::weight_scale_shape: unknown QuantScheme (value " +
                std::to_string(static_cast<int>(scheme)) + ")");
  }
  const auto blocks = [](int64_t n) { return (n + 127) / 128; };
  std::vector<int64_t> shape;
  switch (scheme) {
    case QuantScheme::kNone:
      return shape;
    case QuantScheme::kFp8PerTensor:
      shape = {1};  // one scale a matrix: [E] with the E axis
      break;
    case QuantScheme::kFp8PerChannel:
      shape = {rows};
      break;
    case QuantScheme::kFp8Block128:
      shape = {blocks(rows), blocks(cols)};
      break;
  }
  if (experts) {
    if (scheme == QuantScheme::kFp8PerTensor) shape.clear();
    shape.insert(shape.begin(), E);
  }
  return shape;
}

}  // namespace moekit
