// Plans' one-line form and equality (include/moekit/plan.h).
#include "moekit/plan.h"

namespace moekit {

std::string to_string(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::kDecode:
      return "decode";
    case GemmKernel::kDecodeSplitK:
      return "decode_splitk";
    case GemmKernel::kDecodeStream:
      return "decode_stream";
    case GemmKernel::kDecodeStreamDeep:
      return "decode_stream_deep";
    case GemmKernel::kDecodeStreamNarrow:
      return "decode_stream_narrow";
    case GemmKernel::kDecodePersistent:
      return "decode_persistent";
    case GemmKernel::kSm90:
      return "sm90";
    case GemmKernel::kSm90Pairs:
      return "sm90_pairs";
    case GemmKernel::kFp8Sm90:
      return "fp8_sm90";
  }
  return "?";
}

std::string to_string(const GemmPlan& p) {
  std::string s =
      to_string(p.kernel) + " " + std::to_string(p.tile_m) + "x" + std::to_string(p.tile_n);
  if (p.split > 1) s += " split" + std::to_string(p.split);
  if (p.schedule == GemmSchedule::kDynamic) s += " dynamic";
  if (p.swap_tails) s += " swap_tails";
  return s;
}

std::string to_string(const MlpPlan& p) {
  switch (p.path) {
    case MlpPath::kTwoGemms:
      return "two_gemms{gate_up: " + to_string(p.gate_up) + ", down: " + to_string(p.down) + "}";
    case MlpPath::kChain:
      return "chain{gate_up: " + to_string(p.gate_up) + ", down: " + to_string(p.down) + "}";
    case MlpPath::kGemv:
      return "gemv";
    case MlpPath::kDirect:
      return "direct{split " + std::to_string(p.split_gate_up) + "/" +
             std::to_string(p.split_down) + "}";
    case MlpPath::kStreamK:
      return "streamk{split " + std::to_string(p.split_gate_up) + "/" +
             std::to_string(p.split_down) + "}";
  }
  return "?";
}

std::string to_string(const LayerPlan& p) {
  std::string s =
      p.routed == RoutedPath::kDirect ? std::string("direct") : "sorted " + to_string(p.experts);
  if (p.has_shared) s += " + shared " + to_string(p.shared);
  return s;
}

bool operator==(const GemmPlan& a, const GemmPlan& b) {
  return a.kernel == b.kernel && a.tile_m == b.tile_m && a.tile_n == b.tile_n &&
         a.split == b.split && a.schedule == b.schedule && a.swap_tails == b.swap_tails;
}

bool operator==(const MlpPlan& a, const MlpPlan& b) {
  return a.path == b.path && a.gate_up == b.gate_up && a.down == b.down &&
         a.split_gate_up == b.split_gate_up && a.split_down == b.split_down;
}

bool operator==(const LayerPlan& a, const LayerPlan& b) {
  return a.routed == b.routed && a.experts == b.experts && a.has_shared == b.has_shared &&
         a.shared == b.shared;
}

}  // namespace moekit
