#include "model.h"

#include <algorithm>
#include <stdexcept>

namespace moekit::bench {

namespace {

int64_t dim(const Workload& w, const char* tensor, size_t i) {
  const TensorSpec* t = w.tensor(tensor);
  if (!t || t->shape.size() <= i) return 0;
  return t->shape[i];
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

Dims row_dims(const Row& row) {
  const Workload& w = row.w;
  Dims d;
  const std::string& op = w.op;
  if (op == "FusedTopKFwd") {
    d.T = dim(w, "gating_output", 0);
    d.E = dim(w, "gating_output", 1);
    d.K = w.int_param("top_k", 8);
    d.bias = w.tensor("correction_bias") != nullptr;
  } else if (op == "MoEPermuteAlignFwd") {
    d.T = dim(w, "topk_ids", 0);
    d.K = dim(w, "topk_ids", 1);
    d.E = w.int_param("num_experts", 0);
    d.block_size = w.int_param("block_size", 64);
  } else if (op == "MoEPrePermuteFwd") {
    d.T = dim(w, "hidden_states", 0);
    d.H = dim(w, "hidden_states", 1);
    d.K = dim(w, "local_expert_ids", 1);
    d.E = w.int_param("num_local_experts", 0);
    d.P = d.T * d.K;
  } else if (op == "MoEPostPermuteFwd") {
    d.P = dim(w, "expert_output", 0);
    d.H = dim(w, "expert_output", 1);
    d.T = dim(w, "topk_weights", 0);
    d.K = dim(w, "topk_weights", 1);
  } else if (op == "MoEGroupedGemmFwd" || op == "MoEGroupedGemmFP8Fwd") {
    const TensorSpec* a = w.tensor("a");
    d.masked = a && a->shape.size() == 3;
    d.E = dim(w, "b", 0);
    d.Kd = dim(w, "b", 2);
    d.swiglu = w.param("activation") == "silu_and_mul";
    d.N = d.swiglu ? dim(w, "b", 1) / 2 : dim(w, "b", 1);
    if (d.masked) {
      d.max_m = dim(w, "a", 1);
      d.P = d.E * d.max_m;
      d.T = masked_total_rows(w);
    } else {
      d.P = dim(w, "a", 0);
      d.T = d.P;
    }
  } else if (op == "MoEExpertMLPFwd") {
    d.P = dim(w, "expert_input", 0);
    d.T = d.P;
    d.H = dim(w, "expert_input", 1);
    d.E = dim(w, "w_gate_up", 0);
    d.F = dim(w, "w_gate_up", 1) / 2;
  } else if (op == "FusedMoEExpertsFwd" || op == "IndexedExpertMLPFwd" || op == "FusedMoEFwd" ||
             op == "FusedMoESharedExpertFwd") {
    d.T = dim(w, "hidden_states", 0);
    d.H = dim(w, "hidden_states", 1);
    d.E = dim(w, "w_gate_up", 0);
    d.F = dim(w, "w_gate_up", 1) / 2;
    d.K = w.tensor("topk_ids") ? dim(w, "topk_ids", 1) : w.int_param("top_k", 8);
    d.bias = w.tensor("correction_bias") != nullptr;
    if (op == "FusedMoESharedExpertFwd") d.S = dim(w, "shared_w_gate_up", 0) / 2;
  } else if (op == "SharedExpertMLPFwd") {
    d.T = dim(w, "hidden_states", 0);
    d.H = dim(w, "hidden_states", 1);
    d.S = dim(w, "w_gate_up", 0) / 2;
  } else {
    throw std::invalid_argument("unknown op '" + op + "'");
  }
  return d;
}

RoutingStats full_routing(const Row& row) {
  Dims d = row_dims(row);
  RoutingStats s;
  const std::string& op = row.w.op;
  if (op == "MoEGroupedGemmFwd" || op == "MoEGroupedGemmFP8Fwd") {
    s.routed_rows = d.masked ? std::min(d.T, d.P) : d.P;
  } else if (op == "MoEExpertMLPFwd" || op == "MoEPostPermuteFwd") {
    s.routed_rows = op == "MoEPostPermuteFwd" ? d.T * d.K : d.P;
  } else {
    s.routed_rows = d.T * d.K;
  }
  s.active_experts = d.E;
  return s;
}

Cost op_cost(const Row& row, const RoutingStats& stats_in) {
  const Dims d = row_dims(row);
  RoutingStats st = full_routing(row);
  if (stats_in.routed_rows >= 0) st.routed_rows = stats_in.routed_rows;
  if (stats_in.active_experts >= 0) st.active_experts = stats_in.active_experts;
  const double M = static_cast<double>(st.routed_rows);
  const double A = static_cast<double>(st.active_experts);
  const double in = static_cast<double>(dtype_bytes(row.in_dtype()));
  const double out = static_cast<double>(dtype_bytes(row.out_dtype()));
  const std::string& op = row.w.op;
  Cost c;
  // FP8-weight rows (weight_quant) read e4m3 weights, one byte each, and their f32 scales.
  const double wsize = weight_quant_fp8(row) ? 1.0 : in;
  auto mlp_weights = [&](double experts) {
    return experts * (3.0 * d.F * d.H * wsize + weight_scale_bytes(row, d.H, d.F));
  };
  if (op == "FusedTopKFwd") {
    c.bytes = double(d.T) * d.E * in + (d.bias ? d.E * 4.0 : 0) + double(d.T) * d.K * 8.0;
  } else if (op == "MoEPermuteAlignFwd") {
    double routes = double(d.T) * d.K;
    double sorted = routes + double(d.E) * (d.block_size - 1);
    double blocks = double(ceil_div(static_cast<int64_t>(sorted), d.block_size));
    c.bytes = routes * 4 + sorted * 4 + blocks * 4 + 4;
  } else if (op == "MoEPrePermuteFwd") {
    // tokens and ids in; routed rows, metadata and inverse indices out
    c.bytes = double(d.T) * d.H * in + double(d.T) * d.K * 4 + M * d.H * in + d.E * 4.0 +
              double(d.T) * d.K * 4;
  } else if (op == "MoEPostPermuteFwd") {
    c.bytes = M * d.H * in + double(d.T) * d.K * 8 + double(d.T) * d.H * out;
  } else if (op == "MoEGroupedGemmFwd") {
    double nb = d.swiglu ? 2.0 * d.N : double(d.N);
    c.flops = 2.0 * M * nb * d.Kd;
    c.bytes = M * d.Kd * in + A * nb * d.Kd * in + M * d.N * out + d.E * 4.0;
  } else if (op == "MoEGroupedGemmFP8Fwd") {
    double kb = double(ceil_div(d.Kd, 128)), nb = double(ceil_div(d.N, 128));
    c.flops = 2.0 * M * d.N * d.Kd;
    c.bytes = M * d.Kd * 1 + M * kb * 4 + A * (double(d.N) * d.Kd + nb * kb * 4) + M * d.N * 2 +
              d.E * 4.0;
  } else if (op == "MoEExpertMLPFwd") {
    c.flops = 6.0 * M * d.F * d.H;
    c.bytes = 2.0 * M * d.H * in + mlp_weights(A) + d.E * 4.0;
  } else if (op == "FusedMoEExpertsFwd" || op == "IndexedExpertMLPFwd" || op == "FusedMoEFwd" ||
             op == "FusedMoESharedExpertFwd") {
    c.flops = 6.0 * M * d.F * d.H;
    c.bytes = 2.0 * d.T * d.H * in + mlp_weights(A);
    if (op == "FusedMoEExpertsFwd" || op == "IndexedExpertMLPFwd") {
      c.bytes += double(d.T) * d.K * 8;  // topk_weights + topk_ids
    } else {
      const TensorSpec* g = row.w.tensor("gating_output");
      double gsize = g && !g->dtype.empty() ? double(dtype_bytes(g->dtype)) : in;
      c.bytes += double(d.T) * d.E * gsize + (d.bias ? d.E * 4.0 : 0);
    }
    if (op == "FusedMoESharedExpertFwd") {
      c.flops += 6.0 * d.T * d.S * d.H;
      c.bytes += 3.0 * d.S * d.H * wsize;
    }
  } else if (op == "SharedExpertMLPFwd") {
    c.flops = 6.0 * d.T * d.S * d.H;
    c.bytes = 2.0 * d.T * d.H * in + 3.0 * d.S * d.H * in;
  }
  return c;
}

bool uses_fp8_peak(const std::string& op) {
  return op == "MoEGroupedGemmFP8Fwd";
}

bool weight_quant_fp8(const Row& row) {
  const std::string q = row.w.param("weight_quant", "none");
  return q != "none";
}

double weight_scale_bytes(const Row& row, int64_t H, int64_t F) {
  const std::string q = row.w.param("weight_quant", "none");
  if (q == "fp8_per_tensor") return 2 * 4.0;
  if (q == "fp8_per_channel") return (2.0 * F + H) * 4.0;
  if (q == "fp8_block128") {
    const double hb = double(ceil_div(H, 128));
    return (double(ceil_div(2 * F, 128)) * hb + hb * double(ceil_div(F, 128))) * 4.0;
  }
  return 0;
}

Sol classify(const Cost& cost, bool fp8, const Ceilings& ceil, double measured_ms) {
  Sol s;
  double fpeak = (fp8 ? ceil.fp8_tflops : ceil.bf16_tflops) * 1e12;
  double bpeak = ceil.read_tbps * 1e12;
  s.comp_ms = fpeak > 0 ? cost.flops / fpeak * 1e3 : 0;
  s.mem_ms = bpeak > 0 ? cost.bytes / bpeak * 1e3 : 0;
  s.ideal_ms = std::max(s.comp_ms, s.mem_ms);
  if (s.ideal_ms < 0.005)
    s.bound = "lat";
  else
    s.bound = s.comp_ms > s.mem_ms ? "comp" : "mem";
  s.sol = measured_ms > 0 ? s.ideal_ms / measured_ms : 0;
  return s;
}

double timing_ideal_ms(const Cost& cost, bool fp8) {
  return classify(cost, fp8, Ceilings{}, 0).ideal_ms;
}

}  // namespace moekit::bench
