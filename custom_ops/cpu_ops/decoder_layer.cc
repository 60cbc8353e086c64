// One pre-norm decoder layer (Llama, Qwen2/3 without biases or q/k norms, ERNIE-4.5 dense) in one op
// call, CPU, float32:
//
//   x, residual = fused_add_rms_norm(hidden, residual, input_norm)
//   qkv = x @ Wqkv; RoPE on q and k (in place); attn = append_attention(qkv, caches, ...)
//   x, residual = fused_add_rms_norm(attn @ Wo, residual, post_norm)
//   out = silu_and_mul(x @ Wgate_up) @ Wdown                                   -> (out, residual)
//
// The same host functions as the single ops (cpu_ops.h), so the result is theirs bit for bit; what
// the fusion removes is the Python and Paddle dispatch between them (~12 us per custom-op call, nine
// calls per layer: at batch 1 that was 3 ms of a 22 ms decode step). Each linear weight is either
// GGUF blocks in gguf_interleave_rows' layout (its qtype the ggml id: 2 Q4_0, 3 Q4_1, 8 Q8_0), computed
// by gguf_linear, or dense float32 [in, out] (qtype 0), computed by Paddle's matmul.
// The caller (fastdeploy/model_executor/layers/decoder_layer.py) picks per weight which it passes.
#include <vector>

#include "cpu_ops.h"
#include "paddle/extension.h"

namespace {
paddle::Tensor Linear(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t qtype, int64_t out_features) {
  if (qtype == 0) {
    PD_CHECK(weight.dtype() == paddle::DataType::FLOAT32 && weight.shape().size() == 2,
             "fd_decoder_layer: a dense weight (qtype 0) must be float32 [in, out]");
    return paddle::experimental::matmul(x, weight, false, false);
  }
  return GgufLinear(x, weight, qtype, out_features)[0];
}
}  // namespace

std::vector<paddle::Tensor> DecoderLayer(const paddle::Tensor& hidden, const paddle::Tensor& residual,
                                         const paddle::Tensor& input_norm, const paddle::Tensor& qkv_weight,
                                         const paddle::Tensor& o_weight, const paddle::Tensor& post_norm,
                                         const paddle::Tensor& gate_up_weight, const paddle::Tensor& down_weight,
                                         const paddle::Tensor& positions, const paddle::Tensor& cos,
                                         const paddle::Tensor& sin_signed, const paddle::Tensor& key_cache,
                                         const paddle::Tensor& value_cache, const paddle::Tensor& slot_mapping,
                                         const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder,
                                         const paddle::Tensor& block_tables, const std::vector<int64_t>& qtypes,
                                         int num_heads, int num_kv_heads, int head_dim, int intermediate_size,
                                         float eps, float scale) {
  PD_CHECK(qtypes.size() == 4, "fd_decoder_layer: qtypes needs 4 entries (qkv, o, gate_up, down), got ",
           qtypes.size());
  const int64_t hidden_size = hidden.shape().back();
  auto normed = FusedAddRmsNorm(hidden, residual, input_norm, eps);
  paddle::Tensor qkv = Linear(normed[0], qkv_weight, qtypes[0], (num_heads + 2 * num_kv_heads) * head_dim);
  RotaryEmbedding(qkv, positions, cos, sin_signed, num_heads, num_kv_heads, head_dim);
  auto attn = AppendAttention(qkv, key_cache, value_cache, slot_mapping, cu_seqlens_q, seq_lens_decoder,
                              block_tables, num_heads, scale)[0];
  normed = FusedAddRmsNorm(Linear(attn, o_weight, qtypes[1], hidden_size), normed[1], post_norm, eps);
  auto act = SiluAndMul(Linear(normed[0], gate_up_weight, qtypes[2], 2 * intermediate_size))[0];
  return {Linear(act, down_weight, qtypes[3], hidden_size), normed[1]};
}

PD_BUILD_OP(fd_decoder_layer)
    .Inputs({"Hidden", "Residual", "InputNorm", "QkvWeight", "OWeight", "PostNorm", "GateUpWeight", "DownWeight",
             "Positions", "Cos", "SinSigned", "KeyCache", "ValueCache", "SlotMapping", "CuSeqlensQ",
             "SeqLensDecoder", "BlockTables"})
    .Outputs({"Out", "NewResidual"})
    .Attrs({"qtypes: std::vector<int64_t>", "num_heads: int", "num_kv_heads: int", "head_dim: int",
            "intermediate_size: int", "eps: float",
            "scale: float"})
    .SetKernelFn(PD_KERNEL(DecoderLayer));
