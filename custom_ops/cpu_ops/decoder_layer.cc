// A run of consecutive pre-norm decoder layers with 1-D RoPE and SwiGLU MLPs, dense or sparse MoE (Llama,
// Qwen2, Qwen3, ERNIE-4.5, Qwen3-MoE, ERNIE-4.5-MoE) in one op call, CPU, float32. Per layer l:
//
//   x, residual = fused_add_rms_norm(hidden, residual, input_norms[l])
//   qkv = x @ Wqkv[l] (+ bqkv[l]); qk_rms_norm(qkv, q_norms[l], k_norms[l])?; RoPE on q and k (in place)
//   attn = append_attention(qkv, caches[l], ...)
//   x, residual = fused_add_rms_norm(attn @ Wo[l] (+ bo[l]), residual, post_norms[l])
//   hidden = silu_and_mul(x @ Wgate_up[l] (+ bgate_up[l])) @ Wdown[l] (+ bdown[l])  -> (hidden, residual)
//     or, for a MoE layer (experts_per_layer[l] > 0): hidden = moe_mlp(x) (moe.cc), its shared experts
//     being Wgate_up[l] / Wdown[l] (+ biases; zero-size when it has none)
//
// The same host functions as the single ops (cpu_ops.h), in the order of the layer-by-layer path
// (fastdeploy/model_executor/layers/decoder_layer.py), so the result is theirs bit for bit; a bias is
// added to the product in place, one float32 add per element as Paddle's `y + bias` in Linear.forward.
// What the fusion removes is the Python and Paddle dispatch between them (~12 us per custom-op call,
// nine to fourteen calls per layer). Optional parts are given per layer: a bias, or a q/k norm
// weight, that a layer lacks is a zero-size tensor in its list (Qwen2 has q/k/v biases only, Qwen3
// q/k norms, ERNIE-4.5 with use_bias biases on every linear). Each linear weight is either GGUF blocks
// in gguf_interleave_rows' layout (its qtype the ggml id: 2 Q4_0, 3 Q4_1, 8 Q8_0), computed by
// gguf_linear, packed bf16 / wint8 / wint4 (packed_linear.h's ids 30, 1008, 1004), computed by
// packed_linear, or dense float32 [in, out] (qtype 0), computed by Paddle's matmul (typed_linear.cc);
// qtypes lists them layer by layer (qkv, o, gate_up, down). mlp_intermediate[l] is the dense MLP's
// intermediate size, or the shared experts' (0: none) of a MoE layer. MoE layers' routers ([hidden, E]
// float32; zero-size for dense layers), correction biases (zero-size: none) and experts (gate_up and
// down of every expert of every MoE layer, in layer order; expert_qtypes two per expert) come in their
// own lists (without MoE layers: placeholders, never read). The caller (fastdeploy/model_executor/layers/fused_decoder_layers.py) picks per weight
// which it passes.
#include <vector>

#include "cpu_ops.h"
#include "paddle/extension.h"

std::vector<paddle::Tensor> DecoderLayers(
    const paddle::Tensor& hidden, const paddle::Tensor& residual, const std::vector<paddle::Tensor>& input_norms,
    const std::vector<paddle::Tensor>& qkv_weights, const std::vector<paddle::Tensor>& qkv_biases,
    const std::vector<paddle::Tensor>& q_norms, const std::vector<paddle::Tensor>& k_norms,
    const std::vector<paddle::Tensor>& o_weights, const std::vector<paddle::Tensor>& o_biases,
    const std::vector<paddle::Tensor>& post_norms, const std::vector<paddle::Tensor>& gate_up_weights,
    const std::vector<paddle::Tensor>& gate_up_biases, const std::vector<paddle::Tensor>& down_weights,
    const std::vector<paddle::Tensor>& down_biases, const paddle::Tensor& positions, const paddle::Tensor& cos,
    const paddle::Tensor& sin_signed, const std::vector<paddle::Tensor>& key_caches,
    const std::vector<paddle::Tensor>& value_caches, const paddle::Tensor& slot_mapping,
    const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder, const paddle::Tensor& block_tables,
    const std::vector<paddle::Tensor>& routers, const std::vector<paddle::Tensor>& correction_biases,
    const std::vector<paddle::Tensor>& expert_gate_ups, const std::vector<paddle::Tensor>& expert_downs,
    const std::vector<int64_t>& qtypes, const std::vector<int64_t>& mlp_intermediate,
    const std::vector<int64_t>& experts_per_layer, const std::vector<int64_t>& expert_qtypes, int num_heads,
    int num_kv_heads, int head_dim, float eps, float scale, int moe_top_k, int moe_intermediate, bool moe_normalize,
    float moe_norm_min) {
  const size_t layers = input_norms.size();
  for (const auto* list : {&qkv_weights, &qkv_biases, &q_norms, &k_norms, &o_weights, &o_biases, &post_norms,
                           &gate_up_weights, &gate_up_biases, &down_weights, &down_biases, &key_caches,
                           &value_caches, &routers, &correction_biases}) {
    PD_CHECK(list->size() == layers, "fd_decoder_layers: every per-layer input needs ", layers, " tensors, got ",
             list->size());
  }
  PD_CHECK(qtypes.size() == 4 * layers, "fd_decoder_layers: qtypes needs 4 entries per layer (qkv, o, gate_up, down), got ",
           qtypes.size(), " for ", layers, " layers");
  PD_CHECK(mlp_intermediate.size() == layers && experts_per_layer.size() == layers,
           "fd_decoder_layers: mlp_intermediate and experts_per_layer need one entry per layer");
  int64_t experts = 0;
  for (int64_t e : experts_per_layer) experts += e;
  PD_CHECK(experts == 0 || (expert_gate_ups.size() == static_cast<size_t>(experts) &&
                            expert_downs.size() == static_cast<size_t>(experts) &&
                            expert_qtypes.size() == static_cast<size_t>(2 * experts)),
           "fd_decoder_layers: the layers have ", experts, " experts in all, got ", expert_gate_ups.size(),
           " gate_up and ", expert_downs.size(), " down weights and ", expert_qtypes.size(), " expert qtypes");
  const MoeSpec spec_base{moe_top_k, moe_intermediate, 0, moe_normalize, moe_norm_min};
  int64_t first_expert = 0;
  const int64_t hidden_size = hidden.shape().back(), qkv_size = (num_heads + 2 * num_kv_heads) * head_dim;
  paddle::Tensor h = hidden, r = residual;
  for (size_t l = 0; l < layers; ++l) {
    const int64_t* qt = qtypes.data() + 4 * l;
    auto normed = FusedAddRmsNorm(h, r, input_norms[l], eps);
    paddle::Tensor qkv = TypedLinear(normed[0], qkv_weights[l], qkv_biases[l], qt[0], qkv_size);
    PD_CHECK((q_norms[l].numel() == 0) == (k_norms[l].numel() == 0),
             "fd_decoder_layers: layer ", l, " has a q norm or a k norm without the other");
    if (q_norms[l].numel() != 0) QkRmsNorm(qkv, q_norms[l], k_norms[l], num_heads, num_kv_heads, eps);
    RotaryEmbedding(qkv, positions, cos, sin_signed, num_heads, num_kv_heads, head_dim);
    auto attn = AppendAttention(qkv, key_caches[l], value_caches[l], slot_mapping, cu_seqlens_q, seq_lens_decoder,
                                block_tables, num_heads, scale, 0)[0];
    normed = FusedAddRmsNorm(TypedLinear(attn, o_weights[l], o_biases[l], qt[1], hidden_size), normed[1],
                             post_norms[l], eps);
    if (experts_per_layer[l] > 0) {
      MoeSpec spec = spec_base;
      spec.shared_intermediate = mlp_intermediate[l];
      h = MoeMlp(normed[0], routers[l], correction_biases[l], expert_gate_ups.data() + first_expert,
                 expert_downs.data() + first_expert, expert_qtypes.data() + 2 * first_expert, experts_per_layer[l],
                 gate_up_weights[l], down_weights[l], gate_up_biases[l], down_biases[l], qt[2], qt[3], spec);
      first_expert += experts_per_layer[l];
    } else {
      auto act = GateUpSwiGlu(normed[0], gate_up_weights[l], gate_up_biases[l], qt[2], mlp_intermediate[l]);
      h = TypedLinear(act, down_weights[l], down_biases[l], qt[3], hidden_size);
    }
    r = normed[1];
  }
  return {h, r};
}

PD_BUILD_OP(fd_decoder_layers)
    .Inputs({"Hidden", "Residual", paddle::Vec("InputNorms"), paddle::Vec("QkvWeights"), paddle::Vec("QkvBiases"),
             paddle::Vec("QNorms"), paddle::Vec("KNorms"), paddle::Vec("OWeights"), paddle::Vec("OBiases"),
             paddle::Vec("PostNorms"), paddle::Vec("GateUpWeights"), paddle::Vec("GateUpBiases"),
             paddle::Vec("DownWeights"), paddle::Vec("DownBiases"), "Positions", "Cos", "SinSigned",
             paddle::Vec("KeyCaches"), paddle::Vec("ValueCaches"), "SlotMapping", "CuSeqlensQ", "SeqLensDecoder",
             "BlockTables", paddle::Vec("Routers"), paddle::Vec("CorrectionBiases"), paddle::Vec("ExpertGateUps"),
             paddle::Vec("ExpertDowns")})
    .Outputs({"Out", "NewResidual"})
    .Attrs({"qtypes: std::vector<int64_t>", "mlp_intermediate: std::vector<int64_t>",
            "experts_per_layer: std::vector<int64_t>", "expert_qtypes: std::vector<int64_t>", "num_heads: int",
            "num_kv_heads: int", "head_dim: int", "eps: float", "scale: float", "moe_top_k: int",
            "moe_intermediate: int", "moe_normalize: bool", "moe_norm_min: float"})
    .SetKernelFn(PD_KERNEL(DecoderLayers));
