// gguf_linear's kernel for the row-major types (gguf_rows.h) and fewer than kWideM rows of x (more: the
// broadcast kernel of gguf_linear_wide.h), and the dequantization of one row of any GGUF type (the
// embedding lookup, gguf_embedding.cc).
//
// RowMajorRows: 256 values at a time (a K-quant block, or 8 Q5_0 / Q5_1 blocks) of a W row are dequantized
// into a 1 KB float32 buffer (L1) to gguf-py's values and multiplied with the rows of x by float32 FMAs:
// 4 independent chains per row of x; from 5 rows (a speculative step's verification, a small batch; not
// Q6_K) two W rows at a time, each W vector loaded once for up to 8 rows of x, so the added rows cost
// their FMAs, not loads of W again. The sums reduced once at the row's end. Threads split N
// (gguf_linear.cc).
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "gguf_blocks.h"
#include "gguf_rows.h"

namespace {

// The check gguf_linear and gguf_embedding make of a weight: 2-D uint8 on CPU holding `rows` rows of `K`
// weights of GGUF type `qtype` in the layout gguf_linear reads (row-major as the file stores them, or Q4_0 /
// Q4_1 / Q8_0 interleaved in groups of kGroup rows). `supported` ends the message for an unknown type.
inline void CheckBlockWeight(const paddle::Tensor& weight, int64_t qtype, int64_t rows, int64_t K, const char* op,
                             const std::string& supported) {
  PD_CHECK(weight.is_cpu() && weight.dtype() == paddle::DataType::UINT8 && weight.shape().size() == 2, op,
           ": weight must be 2-D uint8 on CPU");
  const RowFormat rf = RowFormatOf(qtype);
  const Format f = FormatOf(qtype);
  PD_CHECK(rf.values > 0 || f.group_bytes > 0, op, ": unsupported GGUF type id ", qtype, supported);
  if (rf.values > 0) {
    PD_CHECK(K % rf.values == 0 && weight.shape()[0] == rows && weight.shape()[1] == K / rf.values * rf.bytes, op,
             ": weight [", weight.shape()[0], ", ", weight.shape()[1], "] does not hold ", rows, " rows of ", K,
             " weights of type ", qtype, " (blocks of ", rf.values, " in ", rf.bytes, " bytes)");
  } else {
    PD_CHECK(K % kBlock == 0 && weight.shape()[0] == (rows + kGroup - 1) / kGroup &&
                 weight.shape()[1] == K / kBlock * f.group_bytes,
             op, ": weight [", weight.shape()[0], ", ", weight.shape()[1], "] does not hold ", rows,
             " interleaved rows of ", K, " weights");
  }
}

// Row n of a row-major W of type QT ([N, K / values blocks]) -> out[K] float32
template <int64_t QT>
void DequantRowMajor(const uint8_t* w, int64_t K, int64_t n, float* out) {
  const RowFormat f = RowFormatOf(QT);
  const int64_t blocks = K / f.values;
  const uint8_t* row = w + n * blocks * f.bytes;
  for (int64_t b = 0; b < blocks; ++b) DequantRowBlock<QT>(row + b * f.bytes, out + b * f.values);
}

// Row n of W [N, K] of any GGUF type gguf_linear takes (Q4_0 / Q4_1 / Q8_0 interleaved, the others
// row-major) -> out[K] float32, gguf-py's values.
inline void DequantWeightRow(const uint8_t* w, int64_t qtype, int64_t K, int64_t n, float* out) {
  switch (qtype) {
    case kQ5_0: DequantRowMajor<kQ5_0>(w, K, n, out); return;
    case kQ5_1: DequantRowMajor<kQ5_1>(w, K, n, out); return;
    case kQ2_K: DequantRowMajor<kQ2_K>(w, K, n, out); return;
    case kQ3_K: DequantRowMajor<kQ3_K>(w, K, n, out); return;
    case kQ4_K: DequantRowMajor<kQ4_K>(w, K, n, out); return;
    case kQ5_K: DequantRowMajor<kQ5_K>(w, K, n, out); return;
    case kQ6_K: DequantRowMajor<kQ6_K>(w, K, n, out); return;
    default: break;
  }
  const Format f = FormatOf(qtype);
  const int64_t blocks = K / kBlock;
#ifdef __AVX512F__
  switch (qtype) {
    case kQ4_0: DequantRow<kQ4_0>(w, f, blocks, n, 0, blocks, out); return;
    case kQ4_1: DequantRow<kQ4_1>(w, f, blocks, n, 0, blocks, out); return;
    default: DequantRow<kQ8_0>(w, f, blocks, n, 0, blocks, out); return;
  }
#else
  for (int64_t b = 0; b < blocks; ++b) DequantBlockScalar(Ref(w, qtype, f, blocks, n, b), qtype, out + b * kBlock);
#endif
}

#ifdef __AVX512F__
constexpr int kPairRows = 8;  // rows of x per pass over a pair of W rows: 2 x kPairRows accumulators
// Rows of x from which W rows go in pairs: fewer, and Q6_K (whose dequantization needs the registers) at
// any count, run row by row (measured on 2 AMD EPYC Zen 4 cores: benchmarks/README.md, "Verification rows").
constexpr int64_t kPairFromRows = 5;

// y[MR rows (stride N), W rows n and n + 1 (only n when !second)] = x[MR rows (stride K)] . those rows,
// 2 <= MR <= kPairRows: each 256-value step of both rows is dequantized into L1 once, then every 16
// values' two W vectors are loaded once and multiplied with each row of x (one x load per two FMAs).
template <int MR, int64_t QT>
void PairRows(const float* x, int64_t K, const uint8_t* row0, const uint8_t* row1, bool second, float* y,
              int64_t N, int64_t n) {
  const RowFormat f = RowFormatOf(QT);
  const int64_t blocks = K / f.values, per_step = kMaxBlockValues / f.values;
  alignas(64) float buf[2][kMaxBlockValues];
  __m512 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; b += per_step) {
    const int64_t count = std::min(per_step, blocks - b), vectors = count * f.values / 16;
    for (int64_t i = 0; i < count; ++i) {
      DequantRowBlock<QT>(row0 + (b + i) * f.bytes, buf[0] + i * f.values);
      DequantRowBlock<QT>(row1 + (b + i) * f.bytes, buf[1] + i * f.values);
    }
    const float* xb = x + b * f.values;
    for (int64_t v = 0; v < vectors; ++v) {
      const __m512 w0 = _mm512_load_ps(buf[0] + 16 * v), w1 = _mm512_load_ps(buf[1] + 16 * v);
      for (int r = 0; r < MR; ++r) {
        const __m512 xv = _mm512_loadu_ps(xb + r * K + 16 * v);
        acc[r][0] = _mm512_fmadd_ps(w0, xv, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(w1, xv, acc[r][1]);
      }
    }
  }
  for (int r = 0; r < MR; r += 2) {  // sums of rows r and r + 1, four at a time (Sum4)
    const __m512 zero = _mm512_setzero_ps();
    const bool pair = r + 1 < MR;
    alignas(16) float sums[4];
    _mm_store_ps(sums, Sum4(acc[r][0], acc[r][1], pair ? acc[(r + 1) % MR][0] : zero,
                            pair ? acc[(r + 1) % MR][1] : zero));
    for (int s = 0; s < (pair ? 2 : 1); ++s) {
      y[(r + s) * N + n] = sums[2 * s];
      if (second) y[(r + s) * N + n + 1] = sums[2 * s + 1];
    }
  }
}
#endif

// y[m, n] = x[m] . W[n] for rows n0 .. n1 of a row-major W of type QT and M < kWideM rows of x (AVX-512; any M
// portable). AVX-512, from kPairFromRows rows (not Q6_K): pairs of W rows (PairRows), kPairRows rows of x at
// a time (a second pass dequantizes the pair again).
template <int64_t QT>
void RowMajorRows(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, int64_t n0, int64_t n1,
                  float* y) {
  const RowFormat f = RowFormatOf(QT);
#ifdef __AVX512F__
  if (M >= kPairFromRows && QT != kQ6_K) {
    const int64_t row_bytes = K / f.values * f.bytes;
    for (int64_t n = n0; n < n1; n += 2) {
      const bool second = n + 1 < n1;
      const uint8_t* row0 = w + n * row_bytes;
      const uint8_t* row1 = second ? row0 + row_bytes : row0;
      for (int64_t m = 0; m < M; m += kPairRows) {
        const auto args = std::make_tuple(x + m * K, K, row0, row1, second, y + m * N, N, n);
        switch (std::min<int64_t>(kPairRows, M - m)) {
          case 1: std::apply(PairRows<1, QT>, args); break;
          case 2: std::apply(PairRows<2, QT>, args); break;
          case 3: std::apply(PairRows<3, QT>, args); break;
          case 4: std::apply(PairRows<4, QT>, args); break;
          case 5: std::apply(PairRows<5, QT>, args); break;
          case 6: std::apply(PairRows<6, QT>, args); break;
          case 7: std::apply(PairRows<7, QT>, args); break;
          default: std::apply(PairRows<8, QT>, args); break;
        }
      }
    }
    return;
  }
#endif
  // W row by row (any M portable): 256 values at a time (Q5_0 / Q5_1: 8 blocks, so the dot products run 4
  // chains)
  const int64_t blocks = K / f.values, per_step = kMaxBlockValues / f.values;
  alignas(64) float buf[kMaxBlockValues];
#ifdef __AVX512F__
  __m512 acc[kWideM];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    const uint8_t* row = w + n * blocks * f.bytes;
    for (int64_t b = 0; b < blocks; b += per_step) {
      const int64_t count = std::min(per_step, blocks - b), vectors = count * f.values / 16;
      for (int64_t i = 0; i < count; ++i) DequantRowBlock<QT>(row + (b + i) * f.bytes, buf + i * f.values);
      for (int64_t m = 0; m < M; ++m) {
        const float* xm = x + m * K + b * f.values;
        __m512 s0 = acc[m], s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
        int64_t v = 0;
        for (; v + 4 <= vectors; v += 4) {
          s0 = _mm512_fmadd_ps(_mm512_loadu_ps(xm + 16 * v), _mm512_load_ps(buf + 16 * v), s0);
          s1 = _mm512_fmadd_ps(_mm512_loadu_ps(xm + 16 * v + 16), _mm512_load_ps(buf + 16 * v + 16), s1);
          s2 = _mm512_fmadd_ps(_mm512_loadu_ps(xm + 16 * v + 32), _mm512_load_ps(buf + 16 * v + 32), s2);
          s3 = _mm512_fmadd_ps(_mm512_loadu_ps(xm + 16 * v + 48), _mm512_load_ps(buf + 16 * v + 48), s3);
        }
        for (; v < vectors; ++v) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(xm + 16 * v), _mm512_load_ps(buf + 16 * v), s0);
        acc[m] = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
      }
    }
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = _mm512_reduce_add_ps(acc[m]);
  }
#else
  std::vector<float> acc(M);
  for (int64_t n = n0; n < n1; ++n) {
    std::fill(acc.begin(), acc.end(), 0.f);
    const uint8_t* row = w + n * blocks * f.bytes;
    for (int64_t b = 0; b < blocks; b += per_step) {
      const int64_t count = std::min(per_step, blocks - b);
      for (int64_t i = 0; i < count; ++i) DequantRowBlock<QT>(row + (b + i) * f.bytes, buf + i * f.values);
      for (int64_t m = 0; m < M; ++m) {
        const float* xm = x + m * K + b * f.values;
        float dot = 0.f;
        for (int64_t e = 0; e < count * f.values; ++e) dot += xm[e] * buf[e];
        acc[m] += dot;
      }
    }
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = acc[m];
  }
#endif
}

inline void RowMajorProduct(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t qtype, int64_t N,
                            int64_t n0, int64_t n1, float* y) {
  switch (qtype) {
    case kQ5_0: RowMajorRows<kQ5_0>(x, M, K, w, N, n0, n1, y); return;
    case kQ5_1: RowMajorRows<kQ5_1>(x, M, K, w, N, n0, n1, y); return;
    case kQ2_K: RowMajorRows<kQ2_K>(x, M, K, w, N, n0, n1, y); return;
    case kQ3_K: RowMajorRows<kQ3_K>(x, M, K, w, N, n0, n1, y); return;
    case kQ4_K: RowMajorRows<kQ4_K>(x, M, K, w, N, n0, n1, y); return;
    case kQ5_K: RowMajorRows<kQ5_K>(x, M, K, w, N, n0, n1, y); return;
    default: RowMajorRows<kQ6_K>(x, M, K, w, N, n0, n1, y); return;
  }
}

}  // namespace
