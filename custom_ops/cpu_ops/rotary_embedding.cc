// Rotary position embedding (RoPE, Su et al. 2021) applied in place to the fused qkv projection, CPU, float32.
//
//   fd_rotary_embedding(qkv, positions, cos, sin_signed, num_heads, num_kv_heads, head_dim) -> qkv
//
// qkv:        [n, ...] contiguous, each token's row holding at least num_heads + num_kv_heads heads of
//             head_dim values (the fused projection [n, (num_heads + 2 num_kv_heads) * head_dim], or
//             [n, heads, head_dim]); the first num_heads + num_kv_heads heads (q, then k) are rotated in
//             place, the rest of the row (v) is not touched.
// positions:  [n] int64, each in [0, max_position)
// cos:        [max_position, head_dim]  cos(angle), both halves equal
// sin_signed: [max_position, head_dim]  sin(angle) with the first half negated (rotate_half's sign)
//
// These are the tables RotaryEmbedding (fastdeploy/model_executor/layers/rotary_embedding.py) holds,
// and the math is its `apply`, rotate-half ("NeoX") layout: x * cos + roll(x, head_dim / 2) * sin_signed,
// i.e. out[:half] = x1 cos - x2 sin, out[half:] = x2 cos + x1 sin. OpenMP over tokens from
// kParallelElements (as rms_norm.cc's). Paddle hands custom ops contiguous tensors: a strided view of qkv would arrive
// as a contiguous copy and be rotated there (the shim, ops/rotary_embedding.py, refuses such views).
#include <vector>

#include "paddle/extension.h"

namespace {
constexpr int64_t kParallelElements = 1 << 14;

// One head of head_dim = 2 * half values, rotated in place by one table row.
inline void RotateHead(float* x, const float* __restrict cos, const float* __restrict sin, int64_t half) {
#pragma omp simd
  for (int64_t d = 0; d < half; ++d) {
    const float x1 = x[d], x2 = x[d + half];
    x[d] = x1 * cos[d] + x2 * sin[d];
    x[d + half] = x2 * cos[d + half] + x1 * sin[d + half];
  }
}

void CheckArguments(const paddle::Tensor& qkv, const paddle::Tensor& positions, const paddle::Tensor& cos,
                    const paddle::Tensor& sin, int64_t rotated, int64_t head_dim) {
  PD_CHECK(qkv.is_cpu() && positions.is_cpu() && cos.is_cpu() && sin.is_cpu(),
           "fd_rotary_embedding runs on CPU tensors");
  PD_CHECK(qkv.dtype() == paddle::DataType::FLOAT32 && cos.dtype() == paddle::DataType::FLOAT32 &&
               sin.dtype() == paddle::DataType::FLOAT32 && positions.dtype() == paddle::DataType::INT64,
           "fd_rotary_embedding takes float32 qkv and tables and int64 positions");
  const int64_t n = positions.numel();
  PD_CHECK(positions.shape().size() == 1 && qkv.shape().size() >= 2 && qkv.shape()[0] == n,
           "fd_rotary_embedding: qkv's first axis (", qkv.shape()[0], ") must match positions [", n, "]");
  PD_CHECK(head_dim > 0 && head_dim % 2 == 0, "fd_rotary_embedding: head_dim must be even, got ", head_dim);
  PD_CHECK(n == 0 || qkv.numel() / n >= rotated * head_dim, "fd_rotary_embedding: qkv rows have ",
           n == 0 ? 0 : qkv.numel() / n, " values, fewer than the ", rotated * head_dim, " of the q and k heads");
  PD_CHECK(cos.shape().size() == 2 && cos.shape()[1] == head_dim && sin.shape() == cos.shape(),
           "fd_rotary_embedding: cos and sin must both be [max_position, head_dim=", head_dim, "]");
  const int64_t* pos = positions.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    PD_CHECK(pos[i] >= 0 && pos[i] < cos.shape()[0], "fd_rotary_embedding: position ", pos[i],
             " outside the tables' [0, ", cos.shape()[0], ")");
  }
}
}  // namespace

void RotaryEmbedding(paddle::Tensor& qkv, const paddle::Tensor& positions, const paddle::Tensor& cos,
                     const paddle::Tensor& sin, int num_heads, int num_kv_heads, int head_dim) {
  const int64_t rotated = static_cast<int64_t>(num_heads) + num_kv_heads, dim = head_dim, half = dim / 2;
  CheckArguments(qkv, positions, cos, sin, rotated, dim);
  const int64_t n = positions.numel();
  if (n == 0) return;
  const int64_t row = qkv.numel() / n;
  float* data = qkv.data<float>();
  const int64_t* pos = positions.data<int64_t>();
  const float* cos_data = cos.data<float>();
  const float* sin_data = sin.data<float>();
#pragma omp parallel for schedule(static) if (n * rotated * dim >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const float* c = cos_data + pos[i] * dim;
    const float* s = sin_data + pos[i] * dim;
    for (int64_t h = 0; h < rotated; ++h) RotateHead(data + i * row + h * dim, c, s, half);
  }
}

PD_BUILD_OP(fd_rotary_embedding)
    .Inputs({"Qkv", "Positions", "Cos", "SinSigned"})
    .Outputs({"Out"})
    .SetInplaceMap({{"Qkv", "Out"}})
    .Attrs({"num_heads: int", "num_kv_heads: int", "head_dim: int"})
    .SetKernelFn(PD_KERNEL(RotaryEmbedding));
