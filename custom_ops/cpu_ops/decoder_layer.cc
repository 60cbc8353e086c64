// A run of consecutive pre-norm decoder layers (Llama, Qwen2/3 without biases or q/k norms, ERNIE-4.5
// dense) in one op call, CPU, float32. Per layer l:
//
//   x, residual = fused_add_rms_norm(hidden, residual, input_norms[l])
//   qkv = x @ Wqkv[l]; RoPE on q and k (in place); attn = append_attention(qkv, caches[l], ...)
//   x, residual = fused_add_rms_norm(attn @ Wo[l], residual, post_norms[l])
//   hidden = silu_and_mul(x @ Wgate_up[l]) @ Wdown[l]                    -> (hidden, residual) at the end
//
// The same host functions as the single ops (cpu_ops.h), so the result is theirs bit for bit; what
// the fusion removes is the Python and Paddle dispatch between them (~12 us per custom-op call, nine
// calls per layer: at batch 1 that was 3 ms of a 22 ms decode step, and the per-layer Python and
// dispatch of a one-layer op another ~1 ms). Each linear weight is either GGUF blocks in
// gguf_interleave_rows' layout (its qtype the ggml id: 2 Q4_0, 3 Q4_1, 8 Q8_0), computed by
// gguf_linear, packed bf16 / wint8 / wint4 (packed_linear.h's ids 30, 1008, 1004), computed by
// packed_linear, or dense float32 [in, out] (qtype 0), computed by Paddle's matmul; qtypes lists them
// layer by layer (qkv, o, gate_up, down). The caller (fastdeploy/model_executor/layers/decoder_layer.py,
// fused_decoder_layers) picks per weight which it passes.
#include <vector>

#include "cpu_ops.h"
#include "packed_linear.h"
#include "paddle/extension.h"

namespace {
paddle::Tensor Linear(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t qtype, int64_t out_features) {
  if (qtype == 0) {
    PD_CHECK(weight.dtype() == paddle::DataType::FLOAT32 && weight.shape().size() == 2,
             "fd_decoder_layers: a dense weight (qtype 0) must be float32 [in, out]");
    return paddle::experimental::matmul(x, weight, false, false);
  }
  if (packed::KnownKind(qtype)) return PackedLinear(x, weight, qtype, out_features, false)[0];
  return GgufLinear(x, weight, qtype, out_features)[0];
}
}  // namespace

std::vector<paddle::Tensor> DecoderLayers(
    const paddle::Tensor& hidden, const paddle::Tensor& residual, const std::vector<paddle::Tensor>& input_norms,
    const std::vector<paddle::Tensor>& qkv_weights, const std::vector<paddle::Tensor>& o_weights,
    const std::vector<paddle::Tensor>& post_norms, const std::vector<paddle::Tensor>& gate_up_weights,
    const std::vector<paddle::Tensor>& down_weights, const paddle::Tensor& positions, const paddle::Tensor& cos,
    const paddle::Tensor& sin_signed, const std::vector<paddle::Tensor>& key_caches,
    const std::vector<paddle::Tensor>& value_caches, const paddle::Tensor& slot_mapping,
    const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder, const paddle::Tensor& block_tables,
    const std::vector<int64_t>& qtypes, int num_heads, int num_kv_heads, int head_dim, int intermediate_size,
    float eps, float scale) {
  const size_t layers = input_norms.size();
  for (const auto* list : {&qkv_weights, &o_weights, &post_norms, &gate_up_weights, &down_weights, &key_caches,
                           &value_caches}) {
    PD_CHECK(list->size() == layers, "fd_decoder_layers: every per-layer input needs ", layers, " tensors, got ",
             list->size());
  }
  PD_CHECK(qtypes.size() == 4 * layers, "fd_decoder_layers: qtypes needs 4 entries per layer (qkv, o, gate_up, down), got ",
           qtypes.size(), " for ", layers, " layers");
  const int64_t hidden_size = hidden.shape().back(), qkv_size = (num_heads + 2 * num_kv_heads) * head_dim;
  paddle::Tensor h = hidden, r = residual;
  for (size_t l = 0; l < layers; ++l) {
    const int64_t* qt = qtypes.data() + 4 * l;
    auto normed = FusedAddRmsNorm(h, r, input_norms[l], eps);
    paddle::Tensor qkv = Linear(normed[0], qkv_weights[l], qt[0], qkv_size);
    RotaryEmbedding(qkv, positions, cos, sin_signed, num_heads, num_kv_heads, head_dim);
    auto attn = AppendAttention(qkv, key_caches[l], value_caches[l], slot_mapping, cu_seqlens_q, seq_lens_decoder,
                                block_tables, num_heads, scale)[0];
    normed = FusedAddRmsNorm(Linear(attn, o_weights[l], qt[1], hidden_size), normed[1], post_norms[l], eps);
    auto act = SiluAndMul(Linear(normed[0], gate_up_weights[l], qt[2], 2 * intermediate_size))[0];
    h = Linear(act, down_weights[l], qt[3], hidden_size);
    r = normed[1];
  }
  return {h, r};
}

PD_BUILD_OP(fd_decoder_layers)
    .Inputs({"Hidden", "Residual", paddle::Vec("InputNorms"), paddle::Vec("QkvWeights"), paddle::Vec("OWeights"),
             paddle::Vec("PostNorms"), paddle::Vec("GateUpWeights"), paddle::Vec("DownWeights"), "Positions", "Cos",
             "SinSigned", paddle::Vec("KeyCaches"), paddle::Vec("ValueCaches"), "SlotMapping", "CuSeqlensQ",
             "SeqLensDecoder", "BlockTables"})
    .Outputs({"Out", "NewResidual"})
    .Attrs({"qtypes: std::vector<int64_t>", "num_heads: int", "num_kv_heads: int", "head_dim: int",
            "intermediate_size: int", "eps: float", "scale: float"})
    .SetKernelFn(PD_KERNEL(DecoderLayers));
