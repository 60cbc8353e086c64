// exp on 16 floats at once (AVX-512), shared by the CPU ops that need many exponentials per call
// (SwiGLU, QuickGELU, softmax in attention), and the activations built on it: glibc's vector exp is only
// reached when the compiler vectorises a loop, and GCC peels misaligned heads into scalar expf calls.
//
// x = k ln2 + r with k = round(x / ln2), |r| <= ln2 / 2 (ln2 split in a 9-bit head, exact in k * head,
// and a tail: Cody-Waite), exp(r) by its degree-7 Taylor polynomial (truncation error < r^8 / 8! < 6e-9
// relative), then times 2^k with scalef: within ~2 ulp of exp in float64. x is clamped to
// [kExpMin, kExpMax], so results are finite and normal (exp(-87.3) ~ 1.2e-38).
#pragma once
#include <algorithm>
#include <cmath>

namespace fd_cpu {
constexpr float kExpMin = -87.3f, kExpMax = 88.7f;
constexpr float kQuickGeluScale = 1.702f;

// QuickGELU of one float: x / (1 + exp(-1.702 x)), exp's argument clamped as Exp clamps it.
inline float QuickGelu(float x) {
  return x / (1.f + std::exp(std::min(std::max(-kQuickGeluScale * x, kExpMin), kExpMax)));
}

// SwiGLU of one gate and up value: silu(g) * u = g / (1 + exp(-g)) * u, exp's argument clamped as Exp
// clamps it.
inline float SiluTimes(float g, float u) {
  return g / (1.f + std::exp(std::min(std::max(-g, kExpMin), kExpMax))) * u;
}
}  // namespace fd_cpu

#ifdef __AVX512F__
#include <immintrin.h>

namespace fd_cpu {

inline __m512 Exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440054690583e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  for (float c : {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f}) {
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  }
  return _mm512_scalef_ps(p, k);
}

// QuickGELU of 16 floats: x / (1 + Exp(-1.702 x)) (quick_gelu.cc's op, and fd_packed_linear's epilogue).
inline __m512 QuickGelu(__m512 x) {
  const __m512 e = Exp(_mm512_mul_ps(x, _mm512_set1_ps(-kQuickGeluScale)));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

// 1 / a for a in [1, 2^126]: rcp14 (relative error < 2^-14) and one Newton step (error ~2^-28 plus
// rounding, within 1 ulp); cheaper than a vector division, whose throughput bounds SwiGLU otherwise.
inline __m512 Reciprocal(__m512 a) {
  const __m512 y = _mm512_rcp14_ps(a);
  return _mm512_fmadd_ps(y, _mm512_fnmadd_ps(a, y, _mm512_set1_ps(1.f)), y);
}

// SwiGLU of 16 gate and up values: g * Reciprocal(1 + Exp(-g)) * u (swiglu.cc's op, and fd_packed_linear's
// epilogue, so the two give the same bits).
inline __m512 SiluTimes(__m512 g, __m512 u) {
  const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_mul_ps(g, Reciprocal(_mm512_add_ps(_mm512_set1_ps(1.f), e))), u);
}
}  // namespace fd_cpu
#endif
