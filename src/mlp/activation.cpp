// Host helpers of the MLP activations (activation.h).
#include "mlp/activation.h"

namespace moekit::detail {

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kNone:
      return "none";
    case Activation::kSiluAndMul:
      return "silu_and_mul";
    case Activation::kGeluTanhAndMul:
      return "gelu_tanh_and_mul";
    case Activation::kGeluAndMul:
      return "gelu_and_mul";
    case Activation::kRelu2:
      return "relu2";
    case Activation::kSwigluOai:
      return "swiglu_oai";
  }
  return "unknown";
}

bool is_mlp_activation(Activation act) {
  switch (act) {
    case Activation::kSiluAndMul:
    case Activation::kGeluTanhAndMul:
    case Activation::kGeluAndMul:
    case Activation::kRelu2:
    case Activation::kSwigluOai:
      return true;
    case Activation::kNone:
      return false;
  }
  return false;
}

}  // namespace moekit::detail
