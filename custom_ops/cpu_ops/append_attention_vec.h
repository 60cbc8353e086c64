// The 16-float vector that append_attention's kernels are written on: AVX-512 intrinsics where the
// compiler targets them, otherwise a struct of 16 floats whose loops the compiler vectorises. Loads,
// stores, arithmetic, reductions, exp (vec_exp.h), a gather, and SumEach (16 horizontal sums at once).
// A bf16 KV cache holds each value's bit pattern in a uint16_t (Bf16): Load widens 16 of them to
// float32 exactly (the bits shifted up 16); RoundToBf16 is the cache write's rounding (to nearest
// even, as vcvtneps2bf16).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "bf16.h"
#include "vec_exp.h"

namespace fd_attention {

constexpr int64_t kLanes = 16;       // floats per vector; head_dim must be a multiple

using Bf16 = uint16_t;  // a bfloat16's bits: the upper half of the float32 it widens to

using fd_cpu::Bf16ToFloat;  // bf16.h
using fd_cpu::RoundToBf16;

#ifdef __AVX512F__
using Vec = __m512;
inline Vec Load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec Load(const Bf16* p) {  // 16 bf16 widened: zero-extend to 32 bits, shift into the high half
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec Splat(float x) { return _mm512_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline float ReduceAdd(Vec v) { return _mm512_reduce_add_ps(v); }
inline Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec Max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float ReduceMax(Vec v) { return _mm512_reduce_max_ps(v); }
inline Vec ExpOf(Vec v) { return fd_cpu::Exp(v); }
inline Vec Gather(const float* base, const int32_t* offsets) {
  return _mm512_i32gather_ps(_mm512_loadu_si512(offsets), base, sizeof(float));
}
// Lane k of the result = the sum of the lanes of v[k] (a transpose folded into the additions).
inline Vec SumEach(const Vec v[kLanes]) {
  Vec w[8], x[4];
  for (int i = 0; i < 8; ++i)  // 128-bit chunks 0-1: v[2i] folded in half, chunks 2-3: v[2i + 1]
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // chunk j: four partial sums of v[4i + j]
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
  const Vec z0 = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
  const Vec z1 = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
  const Vec sums = _mm512_add_ps(_mm512_shuffle_ps(z0, z1, 0x44), _mm512_shuffle_ps(z0, z1, 0xEE));
  // lane 4j + i now holds the sum of v[4i + j]
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sums);
}
#else  // portable: the same kernels on a 16-float struct, loops the compiler vectorises
struct Vec {
  float x[kLanes];
};
inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(v.x, p, sizeof(v.x));
  return v;
}
inline Vec Load(const Bf16* p) {
  Vec v;
  for (int64_t i = 0; i < kLanes; ++i) v.x[i] = Bf16ToFloat(p[i]);
  return v;
}
inline void Store(float* p, Vec v) { std::memcpy(p, v.x, sizeof(v.x)); }
inline Vec Splat(float s) {
  Vec v;
  for (int64_t i = 0; i < kLanes; ++i) v.x[i] = s;
  return v;
}
inline Vec Fma(Vec a, Vec b, Vec c) {
  for (int64_t i = 0; i < kLanes; ++i) c.x[i] += a.x[i] * b.x[i];
  return c;
}
inline Vec Mul(Vec a, Vec b) {
  for (int64_t i = 0; i < kLanes; ++i) a.x[i] *= b.x[i];
  return a;
}
inline float ReduceAdd(Vec v) {
  float s = 0.f;
  for (int64_t i = 0; i < kLanes; ++i) s += v.x[i];
  return s;
}
inline Vec Add(Vec a, Vec b) {
  for (int64_t i = 0; i < kLanes; ++i) a.x[i] += b.x[i];
  return a;
}
inline Vec Sub(Vec a, Vec b) {
  for (int64_t i = 0; i < kLanes; ++i) a.x[i] -= b.x[i];
  return a;
}
inline Vec Max(Vec a, Vec b) {
  for (int64_t i = 0; i < kLanes; ++i) a.x[i] = std::max(a.x[i], b.x[i]);
  return a;
}
inline float ReduceMax(Vec v) { return *std::max_element(v.x, v.x + kLanes); }
inline Vec ExpOf(Vec v) {
  for (int64_t i = 0; i < kLanes; ++i) v.x[i] = std::exp(v.x[i]);
  return v;
}
inline Vec Gather(const float* base, const int32_t* offsets) {
  Vec v;
  for (int64_t i = 0; i < kLanes; ++i) v.x[i] = base[offsets[i]];
  return v;
}
inline Vec SumEach(const Vec v[kLanes]) {
  Vec sums;
  for (int64_t k = 0; k < kLanes; ++k) sums.x[k] = ReduceAdd(v[k]);
  return sums;
}
#endif

}  // namespace fd_attention
