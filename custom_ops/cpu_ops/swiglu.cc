// SwiGLU activation (Shazeer 2020) on a fused [gate | up] projection, CPU, float32.
//
//   fd_silu_and_mul(gate_up) -> out,  out = silu(gate) * up,  silu(g) = g / (1 + exp(-g))
//
// gate_up: [n, 2 * inter] (gate = gate_up[:, :inter], up = gate_up[:, inter:]);
// out:     [n, inter]
// Reference: Paddle's F.swiglu with one input (the fallback in fastdeploy/model_executor/ops/activation.py).
// exp is our own AVX-512 range-reduced polynomial (vec_exp.h), within ~2 ulp of exp in float64; without
// AVX-512 the loop calls std::exp. exp's argument is clamped to [-87.3, 88.7] (finite results), so
// silu(g) for g < -87.3 comes out as g * ~1e-38 instead of g * exp(g): both round to 0 at the
// precision of anything downstream. OpenMP over rows from kParallelElements (as rms_norm.cc's).
#include <algorithm>
#include <cmath>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "paddle/extension.h"
#include "vec_exp.h"

namespace {
constexpr int64_t kParallelElements = 1 << 14;

#ifdef __AVX512F__
void SiluAndMulRow(const float* gate, const float* up, int64_t inter, float* out) {
  for (int64_t d = 0; d < inter; d += 16) {
    const __mmask16 m = inter - d >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (inter - d)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + d);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + d);
    _mm512_mask_storeu_ps(out + d, m, fd_cpu::SiluTimes(g, u));
  }
}
#else
void SiluAndMulRow(const float* gate, const float* up, int64_t inter, float* out) {
#pragma omp simd
  for (int64_t d = 0; d < inter; ++d) out[d] = fd_cpu::SiluTimes(gate[d], up[d]);
}
#endif
}  // namespace

std::vector<paddle::Tensor> SiluAndMul(const paddle::Tensor& gate_up) {
  PD_CHECK(gate_up.is_cpu() && gate_up.dtype() == paddle::DataType::FLOAT32,
           "fd_silu_and_mul takes a float32 CPU tensor");
  PD_CHECK(gate_up.shape().size() == 2 && gate_up.shape()[1] % 2 == 0,
           "fd_silu_and_mul: gate_up must be [n, 2 * inter]");
  const int64_t n = gate_up.shape()[0], inter = gate_up.shape()[1] / 2;
  auto out = paddle::empty({n, inter}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* in = gate_up.data<float>();
  float* out_data = out.data<float>();
#pragma omp parallel for schedule(static) if (n * inter >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    SiluAndMulRow(in + i * 2 * inter, in + i * 2 * inter + inter, inter, out_data + i * inter);
  }
  return {out};
}

std::vector<std::vector<int64_t>> SiluAndMulInferShape(const std::vector<int64_t>& gate_up) {
  return {{gate_up[0], gate_up[1] / 2}};
}

std::vector<paddle::DataType> SiluAndMulInferDtype(const paddle::DataType& gate_up) { return {gate_up}; }

PD_BUILD_OP(fd_silu_and_mul)
    .Inputs({"GateUp"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(SiluAndMul))
    .SetInferShapeFn(PD_INFER_SHAPE(SiluAndMulInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SiluAndMulInferDtype));
