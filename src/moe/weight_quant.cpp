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

bool parse_quant_scheme(const std::string& text, QuantScheme* out) {
  for (QuantScheme s : kSchemes) {
    if (text == quant_scheme_name(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

}  // namespace moekit
