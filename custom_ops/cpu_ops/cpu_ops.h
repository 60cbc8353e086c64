// The CPU ops' host functions, for ops that compose them (decoder_layer.cc, moe.cc). Each is defined, with its
// contract, in the file named beside it.
#pragma once
#include <vector>

#include "paddle/extension.h"

// gguf_linear.cc: y[M, N] = x[M, K] @ W^T on GGUF blocks W in gguf_interleave_rows' layout (qtype: ggml id)
std::vector<paddle::Tensor> GgufLinear(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t qtype,
                                       int64_t out_features);

// packed_linear.cc: y[M, N] = act(x[M, K] @ W^T (+ bias [N]; zero-size: none)) on W packed as bf16 / wint8 /
// wint4 (packed_linear.h; kind: its id; activation 0: none, 1: QuickGELU)
std::vector<paddle::Tensor> PackedLinear(const paddle::Tensor& x, const paddle::Tensor& weight,
                                         const paddle::Tensor& bias, int64_t kind, int64_t out_features,
                                         bool portable, int64_t activation);

// rms_norm.cc: (rms_norm(x + residual), x + residual)
std::vector<paddle::Tensor> FusedAddRmsNorm(const paddle::Tensor& x, const paddle::Tensor& residual,
                                            const paddle::Tensor& weight, float eps);

// rms_norm.cc: per-head RMSNorm of the q heads (q_weight) and k heads (k_weight) of qkv, in place
void QkRmsNorm(paddle::Tensor& qkv, const paddle::Tensor& q_weight, const paddle::Tensor& k_weight, int num_heads,
               int num_kv_heads, float eps);

// rotary_embedding.cc: RoPE on the q and k heads of qkv [n, (heads + 2 kv_heads) * head_dim], in place
void RotaryEmbedding(paddle::Tensor& qkv, const paddle::Tensor& positions, const paddle::Tensor& cos,
                     const paddle::Tensor& sin, int num_heads, int num_kv_heads, int head_dim);

// append_attention.cc: K/V of qkv written into the paged caches, then causal GQA attention -> [n, heads * head_dim]
std::vector<paddle::Tensor> AppendAttention(const paddle::Tensor& qkv, const paddle::Tensor& key_cache,
                                            const paddle::Tensor& value_cache, const paddle::Tensor& slot_mapping,
                                            const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder,
                                            const paddle::Tensor& block_tables, int num_heads, float scale,
                                            int64_t kernel);

// swiglu.cc: silu(gate) * up of gate_up [n, 2 * inter] -> [n, inter]
std::vector<paddle::Tensor> SiluAndMul(const paddle::Tensor& gate_up);

// typed_linear.cc: y[n, out] = x[n, in] @ W (+ bias) for W dense float32, GGUF blocks or packed (qtype: its id)
paddle::Tensor TypedLinear(const paddle::Tensor& x, const paddle::Tensor& weight, const paddle::Tensor& bias,
                           int64_t qtype, int64_t out_features);
// typed_linear.cc: silu(gate) * up [n, intermediate] of an MLP's gate_up projection of x, in its qtype's layout
paddle::Tensor GateUpSwiGlu(const paddle::Tensor& x, const paddle::Tensor& gate_up, const paddle::Tensor& bias,
                            int64_t qtype, int64_t intermediate);

// moe.cc: the sparse MoE MLP of x [n, hidden] (router, top-k experts, shared experts) -> [n, hidden]
struct MoeSpec {
  int64_t top_k, expert_intermediate, shared_intermediate;  // shared_intermediate 0: no shared experts
  bool normalize;
  float norm_min;
};
paddle::Tensor MoeMlp(const paddle::Tensor& x, const paddle::Tensor& router, const paddle::Tensor& correction_bias,
                      const paddle::Tensor* gate_up, const paddle::Tensor* down, const int64_t* expert_qtypes,
                      int64_t num_experts, const paddle::Tensor& shared_gate_up, const paddle::Tensor& shared_down,
                      const paddle::Tensor& shared_gate_up_bias, const paddle::Tensor& shared_down_bias,
                      int64_t shared_gate_up_qtype, int64_t shared_down_qtype, const MoeSpec& spec);
