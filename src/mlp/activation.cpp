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

void run_general_mlp(const GroupedGemmProblem& up, const GroupedGemmProblem& down,
                     ActivationLaunch act, const MlpBiases& biases, int64_t H, void* out,
                     DType out_dtype, cudaStream_t stream, const char* op) {
  run_grouped_gemm(up, stream, op);
  act.bias = biases.gate_up;
  act.bias_dtype = biases.gate_up_dtype;
  launch_activation(act, stream, op);
  run_grouped_gemm(down, stream, op);
  if (biases.down == nullptr) return;
  act.act = Activation::kNone;
  act.in = static_cast<const float*>(down.c);
  act.cols = H;
  act.bias = biases.down;
  act.bias_dtype = biases.down_dtype;
  act.out = out;
  act.out_dtype = out_dtype;
  launch_activation(act, stream, op);
}

}  // namespace moekit::detail
