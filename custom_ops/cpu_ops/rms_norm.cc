// RMSNorm (Zhang & Sennrich 2019) and RMSNorm after a residual add, CPU, float32.
//
//   fd_rms_norm(x, weight, eps) -> out:
//       out = x * rsqrt(mean(x^2, last axis) + eps) * weight
//   fd_fused_add_rms_norm(x, residual, weight, eps) -> (out, new_residual):
//       new_residual = x + residual; out = fd_rms_norm(new_residual, weight, eps)
//   fd_qk_rms_norm(qkv, q_weight, k_weight, num_heads, num_kv_heads, eps) -> qkv, in place:
//       each q head of qkv normalised with q_weight, each k head with k_weight, v untouched (Qwen3's
//       per-head q/k norm, before RoPE); qkv: [n, (num_heads + 2 num_kv_heads) * head_dim] contiguous,
//       the weights [head_dim]. The layer-by-layer path (decoder_layer.py) and fd_decoder_layers
//       both call it, so the two agree bit for bit.
//
// x, residual: [..., hidden] float32 (each run of `hidden` values is one row: [n, hidden]
// or [n, heads, head_dim]); weight: [hidden]. The math and its order, (x * r) * weight with r
// computed in float32, are transformers' LlamaRMSNorm in fp32 and the pure-Paddle fallback in
// fastdeploy/model_executor/ops/normalization.py. One pass reads each row twice (sum of squares,
// then scale) while it is in L1. Rows are independent: OpenMP over rows from kParallelElements (a batch
// of 16 rows of 1024: below, waking the threads costs more than the norm; above, one thread alone
// leaves the other waiting inside fd_decoder_layers: benchmarks/README.md at commit 9c89004,
// "Norms and RoPE on both threads"). Paddle hands custom
// ops contiguous tensors (a strided view arrives as a contiguous copy).
#include <cmath>
#include <vector>

#include "paddle/extension.h"

namespace {
constexpr int64_t kParallelElements = 1 << 14;

// Mean of the squares of one row (float32 accumulation, vector lanes summed at the end).
inline float MeanSquare(const float* x, int64_t hidden) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < hidden; ++d) sum += x[d] * x[d];
  return sum / static_cast<float>(hidden);
}

inline void NormalizeRow(const float* x, const float* weight, float eps, int64_t hidden, float* out) {
  const float r = 1.f / std::sqrt(MeanSquare(x, hidden) + eps);
#pragma omp simd
  for (int64_t d = 0; d < hidden; ++d) out[d] = x[d] * r * weight[d];
}

// Rows and row length of x, after checking x and weight against each other.
void CheckRows(const paddle::Tensor& x, const paddle::Tensor& weight, const char* op, int64_t* rows,
               int64_t* hidden) {
  PD_CHECK(x.is_cpu() && weight.is_cpu(), op, " runs on CPU tensors");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32 && weight.dtype() == paddle::DataType::FLOAT32, op,
           " takes float32 tensors");
  PD_CHECK(x.shape().size() >= 1, op, " needs an x of rank >= 1");
  *hidden = x.shape().back();
  PD_CHECK(weight.numel() == *hidden, op, ": weight has ", weight.numel(), " values, x's last axis ", *hidden);
  *rows = *hidden == 0 ? 0 : x.numel() / *hidden;
}
}  // namespace

std::vector<paddle::Tensor> RmsNorm(const paddle::Tensor& x, const paddle::Tensor& weight, float eps) {
  int64_t rows, hidden;
  CheckRows(x, weight, "fd_rms_norm", &rows, &hidden);
  auto out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* x_data = x.data<float>();
  const float* w = weight.data<float>();
  float* out_data = out.data<float>();
#pragma omp parallel for schedule(static) if (rows * hidden >= kParallelElements)
  for (int64_t i = 0; i < rows; ++i) NormalizeRow(x_data + i * hidden, w, eps, hidden, out_data + i * hidden);
  return {out};
}

std::vector<paddle::Tensor> FusedAddRmsNorm(const paddle::Tensor& x, const paddle::Tensor& residual,
                                            const paddle::Tensor& weight, float eps) {
  int64_t rows, hidden;
  CheckRows(x, weight, "fd_fused_add_rms_norm", &rows, &hidden);
  PD_CHECK(residual.is_cpu() && residual.dtype() == paddle::DataType::FLOAT32 && residual.shape() == x.shape(),
           "fd_fused_add_rms_norm: residual must be a float32 CPU tensor shaped like x");
  auto out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto sum = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* x_data = x.data<float>();
  const float* r_data = residual.data<float>();
  const float* w = weight.data<float>();
  float* out_data = out.data<float>();
  float* sum_data = sum.data<float>();
#pragma omp parallel for schedule(static) if (rows * hidden >= kParallelElements)
  for (int64_t i = 0; i < rows; ++i) {
    float* h = sum_data + i * hidden;
#pragma omp simd
    for (int64_t d = 0; d < hidden; ++d) h[d] = x_data[i * hidden + d] + r_data[i * hidden + d];
    NormalizeRow(h, w, eps, hidden, out_data + i * hidden);
  }
  return {out, sum};
}

void QkRmsNorm(paddle::Tensor& qkv, const paddle::Tensor& q_weight, const paddle::Tensor& k_weight, int num_heads,
               int num_kv_heads, float eps) {
  PD_CHECK(qkv.is_cpu() && q_weight.is_cpu() && k_weight.is_cpu(), "fd_qk_rms_norm runs on CPU tensors");
  PD_CHECK(qkv.dtype() == paddle::DataType::FLOAT32 && q_weight.dtype() == paddle::DataType::FLOAT32 &&
               k_weight.dtype() == paddle::DataType::FLOAT32,
           "fd_qk_rms_norm takes float32 tensors");
  const int64_t dim = q_weight.numel(), heads = num_heads, kv_heads = num_kv_heads;
  PD_CHECK(k_weight.numel() == dim, "fd_qk_rms_norm: k_weight has ", k_weight.numel(), " values, q_weight ", dim);
  PD_CHECK(qkv.shape().size() == 2 && qkv.shape()[1] == (heads + 2 * kv_heads) * dim,
           "fd_qk_rms_norm: qkv must be [n, (num_heads + 2 num_kv_heads) * head_dim] = [n, ",
           (heads + 2 * kv_heads) * dim, "]");
  const int64_t n = qkv.shape()[0], row = qkv.shape()[1];
  float* data = qkv.data<float>();
  const float* qw = q_weight.data<float>();
  const float* kw = k_weight.data<float>();
#pragma omp parallel for schedule(static) if (n * row >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    float* q = data + i * row;
    for (int64_t h = 0; h < heads; ++h) NormalizeRow(q + h * dim, qw, eps, dim, q + h * dim);
    float* k = q + heads * dim;
    for (int64_t h = 0; h < kv_heads; ++h) NormalizeRow(k + h * dim, kw, eps, dim, k + h * dim);
  }
}

std::vector<std::vector<int64_t>> RmsNormInferShape(const std::vector<int64_t>& x, const std::vector<int64_t>&) {
  return {x};
}

std::vector<paddle::DataType> RmsNormInferDtype(const paddle::DataType& x, const paddle::DataType&) { return {x}; }

std::vector<std::vector<int64_t>> FusedAddRmsNormInferShape(const std::vector<int64_t>& x,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&) {
  return {x, x};
}

std::vector<paddle::DataType> FusedAddRmsNormInferDtype(const paddle::DataType& x, const paddle::DataType&,
                                                        const paddle::DataType&) {
  return {x, x};
}

PD_BUILD_OP(fd_rms_norm)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(RmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormInferDtype));

PD_BUILD_OP(fd_qk_rms_norm)
    .Inputs({"Qkv", "QWeight", "KWeight"})
    .Outputs({"Out"})
    .SetInplaceMap({{"Qkv", "Out"}})
    .Attrs({"num_heads: int", "num_kv_heads: int", "eps: float"})
    .SetKernelFn(PD_KERNEL(QkRmsNorm));

PD_BUILD_OP(fd_fused_add_rms_norm)
    .Inputs({"X", "Residual", "Weight"})
    .Outputs({"Out", "NewResidual"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(FusedAddRmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(FusedAddRmsNormInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FusedAddRmsNormInferDtype));
