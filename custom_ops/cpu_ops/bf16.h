// bfloat16 as the CPU ops hold it: a uint16_t with the upper 16 bits of the float32 it widens to.
// Shared by packed_linear (weights and x), append_attention (a bf16 KV cache) and vision_attention_bf16.
// Rounding is to nearest even, as `vcvtneps2bf16` (a NaN stays a quiet NaN); widening is exact.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace fd_cpu {

inline uint16_t RoundToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// x [count] float32 -> y [count] bf16 (vcvtneps2bf16 16 at a time where the compiler targets AVX512-BF16)
inline void RoundRow(const float* x, int64_t count, uint16_t* y) {
  int64_t i = 0;
#ifdef __AVX512BF16__
  for (; i + 16 <= count; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    std::memcpy(y + i, &h, 32);
  }
#endif
  for (; i < count; ++i) y[i] = RoundToBf16(x[i]);
}

}  // namespace fd_cpu
