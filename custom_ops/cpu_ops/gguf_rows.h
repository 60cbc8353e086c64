// GGUF types kept in the file's own row-major layout (no interleave): Q5_0, Q5_1 and the K-quants Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K. A weight W [N, K] is N rows of K / values blocks, each row the bytes GGUF stores,
// so loading copies each shard's rows and memory holds the file's bytes.
//
// Blocks (ggml's block_q5_0, block_q5_1, block_q2_K, ...; d, dmin, m are IEEE halves):
//   Q5_0  32 values, 22 bytes: d, qh (32 high bits), qs[16] (low nibbles: value j < 16 in qs[j]'s low
//         nibble, j >= 16 in qs[j - 16]'s high one);       w = d * (q - 16)
//   Q5_1  32 values, 24 bytes: d, m, qh, qs[16];              w = d * q + m
//   Q2_K  256 values, 84 bytes: scales[16] (low nibble scale, high nibble min per 16 values), qs[64], d, dmin;
//         w = (d * sc) * q - (dmin * mn), q 2 bits
//   Q3_K  256 values, 110 bytes: hmask[32], qs[64], scales[12] (16 6-bit scales), d;
//         w = (d * (sc - 32)) * q, q = 2 low bits - (high bit ? 0 : 4)
//   Q4_K  256 values, 144 bytes: d, dmin, scales[12] (8 6-bit scales and mins), qs[128];
//         w = (d * sc) * q - (dmin * mn), q 4 bits, per 32 values
//   Q5_K  256 values, 176 bytes: d, dmin, scales[12], qh[32], qs[128]; as Q4_K with q 5 bits
//   Q6_K  256 values, 210 bytes: ql[128], qh[64], scales[16] (int8), d; w = (d * sc) * (q - 32), q 6 bits
// Which bits of which byte each value takes is gguf-py's `dequantize` (gguf/quants.py), read element by
// element in Codes below. Every float operation is the one gguf-py's numpy code makes, in its order, each
// rounded to float32 (no fused multiply-add: the AVX-512 path uses the *_round_ps forms, the portable one
// a volatile product), so the values are bit for bit gguf-py's.
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

#include "gguf_blocks.h"  // Half

namespace {

enum RowType : int64_t { kQ5_0 = 6, kQ5_1 = 7, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

constexpr int64_t kMaxBlockValues = 256;

struct RowFormat {
  int64_t values, bytes;  // per block; {0, 0}: not a row-major type
};

inline RowFormat RowFormatOf(int64_t qtype) {
  switch (qtype) {
    case kQ5_0: return {32, 22};
    case kQ5_1: return {32, 24};
    case kQ2_K: return {256, 84};
    case kQ3_K: return {256, 110};
    case kQ4_K: return {256, 144};
    case kQ5_K: return {256, 176};
    case kQ6_K: return {256, 210};
    default: return {0, 0};
  }
}

// A block as integer codes q[values] and, per 16 values, a scale s and an offset o: w = s * q - o
// (o only where the type has a minimum: HAS_MIN).
struct Codes {
  int8_t q[kMaxBlockValues];
  float s[kMaxBlockValues / 16], o[kMaxBlockValues / 16];
};

template <int64_t QT>
constexpr bool HasMin() {
  return QT == kQ5_1 || QT == kQ2_K || QT == kQ4_K || QT == kQ5_K;
}

// Q4_K / Q5_K: the 6-bit scale and minimum of sub-block j (of 8) from scales[12]
inline void ScaleMinK4(const uint8_t* sc, int j, int& scale, int& min) {
  if (j < 4) {
    scale = sc[j] & 63;
    min = sc[j + 4] & 63;
  } else {
    scale = (sc[j + 4] & 15) | ((sc[j - 4] >> 2) & 0x30);
    min = (sc[j + 4] >> 4) | ((sc[j] >> 2) & 0x30);
  }
}

#ifdef __AVX2__
// 32 bytes at p, each shifted right by `shift` bits and masked (AVX2 has no byte shift: 16-bit lanes,
// the bits a byte takes from its neighbour are masked off)
inline __m256i Bits(const uint8_t* p, int shift, int mask) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(static_cast<char>(mask)));
}
inline void Store32(int8_t* q, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), v); }
#endif

template <int64_t QT>
inline void BlockCodes(const uint8_t* b, Codes& c) {
  if constexpr (QT == kQ5_0 || QT == kQ5_1) {
    const int64_t off = QT == kQ5_0 ? 2 : 4;
    uint32_t qh;
    std::memcpy(&qh, b + off, 4);
    const uint8_t* qs = b + off + 4;
#ifdef __AVX2__
    const __m128i nibbles = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), low4 = _mm_set1_epi8(15);
    const __m256i low = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(nibbles, 4), low4), _mm_and_si128(nibbles, low4));
    // byte e: qh's byte e / 8, tested against bit e % 8
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                                2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
    Store32(c.q, _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(QT == kQ5_0 ? 16 : 0)));
#else
    for (int e = 0; e < 32; ++e) {
      const int lo = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
      c.q[e] = static_cast<int8_t>((lo | (((qh >> e) & 1) << 4)) - (QT == kQ5_0 ? 16 : 0));
    }
#endif
    c.s[0] = c.s[1] = Half(b);
    if (QT == kQ5_1) c.o[0] = c.o[1] = -Half(b + 2);  // w = d q + m = d q - (-m), exactly
  } else if constexpr (QT == kQ2_K) {
    const uint8_t *scales = b, *qs = b + 16;
#ifdef __AVX2__
    for (int e = 0; e < 256; e += 32) Store32(c.q + e, Bits(qs + (e / 128) * 32, 2 * ((e / 32) % 4), 3));
#else
    for (int e = 0; e < 256; ++e) c.q[e] = static_cast<int8_t>((qs[(e / 128) * 32 + e % 32] >> (2 * ((e / 32) % 4))) & 3);
#endif
    const float d = Half(b + 80), dmin = Half(b + 82);
    for (int g = 0; g < 16; ++g) {
      c.s[g] = d * static_cast<float>(scales[g] & 15);
      c.o[g] = dmin * static_cast<float>(scales[g] >> 4);
    }
  } else if constexpr (QT == kQ3_K) {
    const uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
#ifdef __AVX2__
    for (int e = 0; e < 256; e += 32) {  // low + 4 high - 4
      const __m256i low = Bits(qs + (e / 128) * 32, 2 * ((e / 32) % 4), 3), high = Bits(hmask, e / 32, 1);
      Store32(c.q + e, _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 2)), _mm256_set1_epi8(4)));
    }
#else
    for (int e = 0; e < 256; ++e) {
      const int low = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e / 32) % 4))) & 3;
      const int high = (hmask[e % 32] >> (e / 32)) & 1;
      c.q[e] = static_cast<int8_t>(low - (high ? 0 : 4));
    }
#endif
    const float d = Half(b + 108);
    for (int j = 0; j < 16; ++j) {
      const int sc = ((scales[j % 8] >> (4 * (j / 8))) & 15) | (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
      c.s[j] = d * static_cast<float>(sc - 32);
    }
  } else if constexpr (QT == kQ4_K || QT == kQ5_K) {
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (QT == kQ4_K ? 16 : 48);
#ifdef __AVX2__
    for (int e = 0; e < 256; e += 32) {
      __m256i q = Bits(qs + (e / 64) * 32, 4 * ((e / 32) % 2), 15);
      if (QT == kQ5_K) q = _mm256_or_si256(q, _mm256_slli_epi16(Bits(qh, e / 32, 1), 4));
      Store32(c.q + e, q);
    }
#else
    for (int e = 0; e < 256; ++e) {
      int q = (qs[(e / 64) * 32 + e % 32] >> (4 * ((e / 32) % 2))) & 15;
      if (QT == kQ5_K) q |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
      c.q[e] = static_cast<int8_t>(q);
    }
#endif
    const float d = Half(b), dmin = Half(b + 2);
    for (int j = 0; j < 8; ++j) {
      int scale, min;
      ScaleMinK4(scales, j, scale, min);
      c.s[2 * j] = c.s[2 * j + 1] = d * static_cast<float>(scale);
      c.o[2 * j] = c.o[2 * j + 1] = dmin * static_cast<float>(min);
    }
  } else {  // Q6_K
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
#ifdef __AVX2__
    for (int e = 0; e < 256; e += 32) {  // 32 values from r = e % 128: r % 64 runs over 32 consecutive bytes
      const int h = e / 128, r = e % 128;
      const __m256i low = Bits(ql + h * 64 + r % 64, 4 * (r / 64), 15), high = Bits(qh + h * 32, 2 * (r / 32), 3);
      Store32(c.q + e, _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32)));
    }
#else
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, r = e % 128;
      const int low = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 15;
      const int high = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
      c.q[e] = static_cast<int8_t>((low | (high << 4)) - 32);
    }
#endif
    const float d = Half(b + 208);
    for (int g = 0; g < 16; ++g) c.s[g] = d * static_cast<float>(scales[g]);
  }
}

// One block of row-major type QT -> w[values] float32, gguf-py's values.
template <int64_t QT>
inline void DequantRowBlock(const uint8_t* block, float* w) {
  Codes c;
  BlockCodes<QT>(block, c);
  constexpr int64_t groups = (QT == kQ5_0 || QT == kQ5_1 ? 32 : 256) / 16;
#ifdef __AVX512F__
  constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t g = 0; g < groups; ++g) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c.q + 16 * g));
    __m512 v = _mm512_mul_round_ps(_mm512_set1_ps(c.s[g]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), kRoundNearest);
    if (HasMin<QT>()) v = _mm512_sub_round_ps(v, _mm512_set1_ps(c.o[g]), kRoundNearest);
    _mm512_storeu_ps(w + 16 * g, v);
  }
#else
  for (int64_t e = 0; e < 16 * groups; ++e) {
    volatile float product = c.s[e / 16] * static_cast<float>(c.q[e]);  // rounded before the subtraction
    w[e] = HasMin<QT>() ? product - c.o[e / 16] : product;
  }
#endif
}

}  // namespace
