// QuickGELU, the sigmoid approximation of GELU (Hendrycks & Gimpel 2016, "GELUs", section 2) used by
// CLIP-style vision MLPs (ERNIE-4.5-VL's vision tower), CPU, float32:
//
//   fd_quick_gelu(x) -> out = x * sigmoid(1.702 x) = x / (1 + exp(-1.702 x)),  out the shape of x
//
// Reference: transformers' QuickGELUActivation (x * torch.sigmoid(1.702 * x)); the fallback in
// fastdeploy/model_executor/ops/activation.py. One pass over memory instead of the three of
// scale, sigmoid and multiply. exp is vec_exp.h's (within ~2 ulp; argument clamped to [-87.3, 88.7],
// so x < -51 gives x * ~1e-38 instead of a smaller magnitude); without AVX-512 std::exp.
#include <algorithm>
#include <cmath>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "paddle/extension.h"
#include "vec_exp.h"

namespace {
constexpr int64_t kParallelElements = 1 << 17;
constexpr int64_t kChunk = 1 << 14;  // elements per OpenMP work unit

void QuickGeluRange(const float* x, int64_t count, float* out) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i < count; i += 16) {
    const __mmask16 m = count - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (count - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, fd_cpu::QuickGelu(_mm512_maskz_loadu_ps(m, x + i)));
  }
#endif
  for (; i < count; ++i) out[i] = fd_cpu::QuickGelu(x[i]);
}
}  // namespace

std::vector<paddle::Tensor> QuickGelu(const paddle::Tensor& x) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32, "fd_quick_gelu takes a float32 CPU tensor");
  auto out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  const int64_t n = x.numel();
  const float* in = x.data<float>();
  float* y = out.data<float>();
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (int64_t start = 0; start < n; start += kChunk) QuickGeluRange(in + start, std::min(kChunk, n - start), y + start);
  return {out};
}

std::vector<std::vector<int64_t>> QuickGeluInferShape(const std::vector<int64_t>& x) { return {x}; }

std::vector<paddle::DataType> QuickGeluInferDtype(const paddle::DataType& x) { return {x}; }

PD_BUILD_OP(fd_quick_gelu)
    .Inputs({"X"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(QuickGelu))
    .SetInferShapeFn(PD_INFER_SHAPE(QuickGeluInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(QuickGeluInferDtype));
