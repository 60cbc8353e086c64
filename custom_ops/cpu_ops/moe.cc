// Sparse mixture-of-experts MLP, CPU, float32 activations (Shazeer et al. 2017; Qwen3-MoE and ERNIE-4.5-MoE
// as transformers computes them; fastdeploy/model_executor/layers/moe.py holds the numpy reference):
//
//   logits = x @ router                                  [n, E], Paddle's matmul (the router is float32)
//   p = softmax(logits) per token                        float32, max subtracted
//   chosen = the top_k experts by p + correction_bias    (ERNIE's moe_statics; none: by p), ties to the lower id
//   w = p[chosen], divided by max(sum w, norm_min) when `normalize`
//   out = sum over chosen e of w_e * down_e(silu(gate_e) * up_e)(x)   (+ the shared experts' MLP of x)
//
// x: [n, hidden]; router: [hidden, E]; correction_bias: [E] or [1, E], or zero-size for none; gate_up[e]
// and down[e]: expert e's weights in any typed_linear.cc format (expert_qtypes[2e], [2e + 1]), no bias;
// shared_gate_up / shared_down (+ biases): the shared experts as one SwiGLU MLP of `shared_intermediate`,
// zero-size tensors when there are none. Each expert runs once per call on the tokens routed to it
// (gathered in token order); its weighted rows are added into out expert by expert, in expert order,
// then the shared experts' output is added (the order of moe.py's SparseMoE.forward). The one host
// function serves the fd_moe_mlp op (SparseMoE.forward) and fd_decoder_layers, so both paths agree bit
// for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu_ops.h"

namespace {
struct Routed {
  int64_t token;
  float weight;
};

// Per expert, the tokens routed to it (ascending) with their mixing weights. logits: [n, E].
std::vector<std::vector<Routed>> Route(const float* logits, int64_t n, int64_t E, const float* bias,
                                       const MoeSpec& spec) {
  std::vector<std::vector<Routed>> routed(E);
  std::vector<float> p(E), score(E);
  std::vector<int64_t> order(E);
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * E;
    const float top = *std::max_element(l, l + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(l[e] - top);
    for (int64_t e = 0; e < E; ++e) {
      p[e] /= sum;
      score[e] = bias ? p[e] + bias[e] : p[e];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + spec.top_k, order.end(),
                      [&](int64_t a, int64_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
    float total = 0.f;
    for (int64_t j = 0; j < spec.top_k; ++j) total += p[order[j]];
    const float denom = spec.normalize ? std::max(total, spec.norm_min) : 1.f;
    for (int64_t j = 0; j < spec.top_k; ++j) {
      const float w = p[order[j]];
      routed[order[j]].push_back({t, spec.normalize ? w / denom : w});
    }
  }
  return routed;
}

// down(silu(gate) * up)(x) of one SwiGLU MLP.
paddle::Tensor SwigluMlp(const paddle::Tensor& x, const paddle::Tensor& gate_up, const paddle::Tensor& gate_up_bias,
                         int64_t gate_up_qtype, const paddle::Tensor& down, const paddle::Tensor& down_bias,
                         int64_t down_qtype, int64_t intermediate, int64_t hidden) {
  const paddle::Tensor h = GateUpSwiGlu(x, gate_up, gate_up_bias, gate_up_qtype, intermediate);
  return TypedLinear(h, down, down_bias, down_qtype, hidden);
}
}  // namespace

paddle::Tensor MoeMlp(const paddle::Tensor& x, const paddle::Tensor& router, const paddle::Tensor& correction_bias,
                      const paddle::Tensor* gate_up, const paddle::Tensor* down, const int64_t* expert_qtypes,
                      int64_t num_experts, const paddle::Tensor& shared_gate_up, const paddle::Tensor& shared_down,
                      const paddle::Tensor& shared_gate_up_bias, const paddle::Tensor& shared_down_bias,
                      int64_t shared_gate_up_qtype, int64_t shared_down_qtype, const MoeSpec& spec) {
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2, "fd_moe_mlp: x must be float32 [n, hidden]");
  const int64_t n = x.shape()[0], hidden = x.shape()[1], E = num_experts;
  PD_CHECK(router.dtype() == paddle::DataType::FLOAT32 && router.shape() == std::vector<int64_t>({hidden, E}),
           "fd_moe_mlp: the router must be float32 [hidden, experts] = [", hidden, ", ", E, "]");
  PD_CHECK(correction_bias.numel() == 0 || (correction_bias.numel() == E &&
                                            correction_bias.dtype() == paddle::DataType::FLOAT32),
           "fd_moe_mlp: correction_bias must be float32 with one value per expert (", E, ") or empty, got ",
           correction_bias.numel(), " values");
  PD_CHECK(spec.top_k >= 1 && spec.top_k <= E, "fd_moe_mlp: top_k (", spec.top_k, ") must be in [1, ", E, "]");
  auto out = paddle::full({n, hidden}, 0.f, paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (n == 0) return out;
  const paddle::Tensor logits = paddle::experimental::matmul(x, router, false, false);  // [n, E]
  const auto routed = Route(logits.data<float>(), n, E,
                            correction_bias.numel() ? correction_bias.data<float>() : nullptr, spec);
  const paddle::Tensor none = paddle::empty({0}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* xd = x.data<float>();
  float* o = out.data<float>();
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<Routed>& tokens = routed[e];
    if (tokens.empty()) continue;
    const int64_t count = static_cast<int64_t>(tokens.size());
    auto xe = paddle::empty({count, hidden}, paddle::DataType::FLOAT32, paddle::CPUPlace());  // [count, hidden]
    float* rows = xe.data<float>();
    for (int64_t r = 0; r < count; ++r) std::memcpy(rows + r * hidden, xd + tokens[r].token * hidden, hidden * 4);
    const paddle::Tensor y = SwigluMlp(xe, gate_up[e], none, expert_qtypes[2 * e], down[e], none,
                                       expert_qtypes[2 * e + 1], spec.expert_intermediate, hidden);
    const float* yd = y.data<float>();
    for (int64_t r = 0; r < count; ++r) {
      float* dst = o + tokens[r].token * hidden;
      const float* src = yd + r * hidden;
      const float w = tokens[r].weight;
#pragma omp simd
      for (int64_t d = 0; d < hidden; ++d) dst[d] += w * src[d];
    }
  }
  if (spec.shared_intermediate > 0) {
    const paddle::Tensor s = SwigluMlp(x, shared_gate_up, shared_gate_up_bias, shared_gate_up_qtype, shared_down,
                                       shared_down_bias, shared_down_qtype, spec.shared_intermediate, hidden);
    const float* sd = s.data<float>();
#pragma omp simd
    for (int64_t i = 0; i < n * hidden; ++i) o[i] += sd[i];
  }
  return out;
}

std::vector<paddle::Tensor> MoeMlpOp(const paddle::Tensor& x, const paddle::Tensor& router,
                                     const paddle::Tensor& correction_bias,
                                     const std::vector<paddle::Tensor>& gate_up, const std::vector<paddle::Tensor>& down,
                                     const paddle::Tensor& shared_gate_up, const paddle::Tensor& shared_down,
                                     const paddle::Tensor& shared_gate_up_bias, const paddle::Tensor& shared_down_bias,
                                     const std::vector<int64_t>& expert_qtypes, const std::vector<int64_t>& shared_qtypes,
                                     int top_k, int expert_intermediate, int shared_intermediate, bool normalize,
                                     float norm_min) {
  const int64_t E = static_cast<int64_t>(gate_up.size());
  PD_CHECK(down.size() == gate_up.size() && expert_qtypes.size() == static_cast<size_t>(2 * E),
           "fd_moe_mlp: needs one gate_up and one down weight per expert and 2 qtypes per expert; got ",
           gate_up.size(), ", ", down.size(), " and ", expert_qtypes.size());
  PD_CHECK(shared_qtypes.size() == 2, "fd_moe_mlp: shared_qtypes holds the shared gate_up's and down's type ids");
  const MoeSpec spec{top_k, expert_intermediate, shared_intermediate, normalize, norm_min};
  return {MoeMlp(x, router, correction_bias, gate_up.data(), down.data(), expert_qtypes.data(), E, shared_gate_up,
                 shared_down, shared_gate_up_bias, shared_down_bias, shared_qtypes[0], shared_qtypes[1], spec)};
}

PD_BUILD_OP(fd_moe_mlp)
    .Inputs({"X", "Router", "CorrectionBias", paddle::Vec("ExpertGateUp"), paddle::Vec("ExpertDown"), "SharedGateUp",
             "SharedDown", "SharedGateUpBias", "SharedDownBias"})
    .Outputs({"Out"})
    .Attrs({"expert_qtypes: std::vector<int64_t>", "shared_qtypes: std::vector<int64_t>", "top_k: int",
            "expert_intermediate: int", "shared_intermediate: int", "normalize: bool", "norm_min: float"})
    .SetKernelFn(PD_KERNEL(MoeMlpOp));
