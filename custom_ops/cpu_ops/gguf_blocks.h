// The weight layout gguf_linear reads and gguf_interleave_rows writes (gguf_linear.cc's header
// describes it): ggml's type ids, the bytes of a block and of a group's block column, the address of
// one row's block, and its dequantization to float32 (AVX-512: in registers; DequantBlockScalar
// without), the IEEE half every GGUF scale is stored as (Half), and the kernels' horizontal sums
// (Sum4). Shared by gguf_interleave.cc and gguf_linear.cc with its kernel headers (gguf_rows.h too).
// In an unnamed namespace, as when this code lived in gguf_linear.cc: internal to each file that
// includes it, so the compiler inlines it as before and the module exports none of it.
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "paddle/extension.h"

namespace {

// IEEE half at p -> float
inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 31, mantissa = h & 1023;
  if (exponent == 0) {  // zero or subnormal
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  const uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                       : sign | ((exponent + 112) << 23) | (mantissa << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = 4;                 // rows interleaved per group
constexpr int64_t kTileRows = 16;             // W rows per unit of the threads' split of N, a multiple of kGroup
constexpr int64_t kParallelWork = 1 << 18;    // multiply-adds below which one thread is faster
constexpr int64_t kWideM = 16;                // rows of x from which the broadcast kernel is used
constexpr int64_t kPrefetchBytes = 3072;      // software prefetch distance in the weight stream (M < 16)

enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8 };  // ggml's type ids

constexpr int64_t kScaleRun = 4 * kGroup;    // bytes of one float32 scale per row of a group

// Bytes of one group's block column: scales (float32) then quants, for 4 rows.
struct Format {
  int64_t gguf_bytes, scale_bytes, quant_bytes, group_bytes;
};

inline Format FormatOf(int64_t qtype) {
  switch (qtype) {
    case kQ4_0: return {18, kScaleRun, 16, kScaleRun + kGroup * 16};
    case kQ4_1: return {20, 2 * kScaleRun, 16, 2 * kScaleRun + kGroup * 16};
    case kQ8_0: return {34, kScaleRun, 32, kScaleRun + kGroup * 32};
    default: return {0, 0, 0, 0};
  }
}

// Block b of row n in the interleaved layout: its quants, scale d and minimum m (0 unless Q4_1).
struct BlockRef {
  const uint8_t* q;
  float d, m;
};

inline BlockRef Ref(const uint8_t* w, int64_t qtype, const Format& f, int64_t blocks, int64_t n, int64_t b) {
  const uint8_t* g = w + ((n / kGroup) * blocks + b) * f.group_bytes;
  const int64_t r = n % kGroup;
  BlockRef ref{g + f.scale_bytes + r * f.quant_bytes, 0.f, 0.f};
  std::memcpy(&ref.d, g + 4 * r, 4);
  if (qtype == kQ4_1) std::memcpy(&ref.m, g + kScaleRun + 4 * r, 4);
  return ref;
}

#ifdef __AVX512F__
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// One block -> (w[0:16], w[16:32]). The *_round_ps forms keep product and sum separately rounded.
template <int64_t QT>
inline void DequantBlock(const uint8_t* q, float d, float m, __m512& w0, __m512& w1) {
  const __m512 dv = _mm512_set1_ps(d);
  if (QT == kQ8_0) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    w0 = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v))), dv, kRound);
    w1 = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1))), dv, kRound);
    return;
  }
  // 4-bit types: the block's 16 possible weights in one register, rounded as gguf-py rounds them, then
  // looked up per nibble (vpermps reads the low 4 bits of each index, so no masking is needed).
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m512i lo = _mm512_cvtepu8_epi32(v), hi = _mm512_cvtepu8_epi32(_mm_srli_epi16(v, 4));
  const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 table = QT == kQ4_1 ? _mm512_add_round_ps(_mm512_mul_round_ps(codes, dv, kRound), _mm512_set1_ps(m), kRound)
                                   : _mm512_mul_round_ps(_mm512_sub_ps(codes, _mm512_set1_ps(8.f)), dv, kRound);
  w0 = _mm512_permutexvar_ps(lo, table);
  w1 = _mm512_permutexvar_ps(hi, table);
}

// (sum of a's lanes, of b's, of c's, of d's): four horizontal sums sharing their shuffles.
inline __m128 Sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // per 128-bit lane: (a0 + a2, b0 + b2, a1 + a3, b1 + b3), the same for c, d
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // per 128-bit lane: (a, b, c, d) partial sums
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512 lanes = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                                     _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(lanes),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// Blocks b0 .. b0 + count of row n -> w[count * 32]
template <int64_t QT>
void DequantRow(const uint8_t* wq, const Format& f, int64_t blocks, int64_t n, int64_t b0, int64_t count, float* w) {
  for (int64_t b = 0; b < count; ++b) {
    const BlockRef ref = Ref(wq, QT, f, blocks, n, b0 + b);
    __m512 w0, w1;
    DequantBlock<QT>(ref.q, ref.d, ref.m, w0, w1);
    _mm512_storeu_ps(w + b * kBlock, w0);
    _mm512_storeu_ps(w + b * kBlock + 16, w1);
  }
}
#endif

#ifndef __AVX512F__
// ---- portable dequantization of one block into 32 floats ----------------------------------------
inline void DequantBlockScalar(const BlockRef& ref, int64_t qtype, float* w) {
  if (qtype == kQ8_0) {
    const int8_t* q = reinterpret_cast<const int8_t*>(ref.q);
    for (int j = 0; j < 32; ++j) w[j] = static_cast<float>(q[j]) * ref.d;
    return;
  }
  for (int j = 0; j < 16; ++j) {
    const int lo = ref.q[j] & 15, hi = ref.q[j] >> 4;
    if (qtype == kQ4_1) {
      w[j] = static_cast<float>(lo) * ref.d + ref.m;
      w[j + 16] = static_cast<float>(hi) * ref.d + ref.m;
    } else {
      w[j] = static_cast<float>(lo - 8) * ref.d;
      w[j + 16] = static_cast<float>(hi - 8) * ref.d;
    }
  }
}

#endif

inline void CheckWeight(const paddle::Tensor& weight, int64_t qtype, const Format& f, const char* op) {
  PD_CHECK(weight.is_cpu() && weight.dtype() == paddle::DataType::UINT8, op, ": weight must be uint8 on CPU");
  PD_CHECK(f.group_bytes > 0, op, ": unsupported GGUF type id ", qtype, " (supported: 2 Q4_0, 3 Q4_1, 8 Q8_0)");
  PD_CHECK(weight.shape().size() == 2, op, ": weight must be 2-D");
}

}  // namespace
