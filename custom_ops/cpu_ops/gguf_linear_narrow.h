// gguf_linear's kernel for few rows of x (M < 16, AVX-512) on the interleaved types (Q4_0 / Q4_1 / Q8_0),
// a template instantiated by gguf_linear.cc's dispatch: a speculative-decoding step's verification (k + 1
// rows of one request) and a decode batch of a few sequences. Per group of 4 W rows, each block is
// dequantized in registers once and used for up to kNarrowRows rows of x (more rows: the next kNarrowRows
// run over the same group, whose bytes are then in L1), so W streams from memory once whatever M, and
// the cost over one row is the FMAs of the added rows only.
// In an unnamed namespace, as when this code lived in gguf_linear.cc: internal to each file that
// includes it, so the compiler inlines it as before and the module exports none of it.
#pragma once
#ifdef __AVX512F__
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "gguf_blocks.h"

namespace {

constexpr int kNarrowRows = 8;  // rows of x per pass over a group: MR x CR <= 16 accumulators

// y[MR rows (stride N), rows n .. n + 3 of W, those < N] = x[MR rows (stride K)] . the group whose first
// block column is at `column`. The group's rows are taken CR at a time (4 up to 4 rows of x, else 2: MR x
// CR float32 accumulators, 2 CR dequantized vectors and x's 2 in registers); each block's CR rows are
// dequantized once and multiplied with every row of x. `prefetch`: this pass reads the group from
// memory, so its stream is prefetched kPrefetchBytes ahead.
template <int MR, int64_t QT>
void GroupRows(const float* x, const uint8_t* column0, int64_t K, int64_t N, int64_t n, bool prefetch, float* y) {
  constexpr int CR = MR <= 4 ? 4 : 2;
  const Format f = FormatOf(QT);
  const int64_t blocks = K / kBlock;
  for (int c0 = 0; c0 < kGroup; c0 += CR) {
    __m512 acc[MR][CR];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < CR; ++c) acc[r][c] = _mm512_setzero_ps();
    const uint8_t* column = column0;
    for (int64_t b = 0; b < blocks; ++b, column += f.group_bytes) {
      if (prefetch && c0 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(column + kPrefetchBytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(column + kPrefetchBytes + 64), _MM_HINT_T0);
        if (f.group_bytes > 128)
          _mm_prefetch(reinterpret_cast<const char*>(column + kPrefetchBytes + 128), _MM_HINT_T0);
      }
      const float* scales = reinterpret_cast<const float*>(column);
      if constexpr (MR <= 3) {  // x's rows in registers, each W row dequantized and used at once
        __m512 x0[MR], x1[MR];
        for (int r = 0; r < MR; ++r) {
          x0[r] = _mm512_loadu_ps(x + r * K + b * kBlock);
          x1[r] = _mm512_loadu_ps(x + r * K + b * kBlock + 16);
        }
        for (int c = 0; c < CR; ++c) {
          __m512 w0, w1;
          DequantBlock<QT>(column + f.scale_bytes + (c0 + c) * f.quant_bytes, scales[c0 + c],
                           QT == kQ4_1 ? scales[kGroup + c0 + c] : 0.f, w0, w1);
          for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(w1, x1[r], _mm512_fmadd_ps(w0, x0[r], acc[r][c]));
        }
      } else {  // the pass's W rows in registers, x's rows loaded in turn
        __m512 w0[CR], w1[CR];
        for (int c = 0; c < CR; ++c)
          DequantBlock<QT>(column + f.scale_bytes + (c0 + c) * f.quant_bytes, scales[c0 + c],
                           QT == kQ4_1 ? scales[kGroup + c0 + c] : 0.f, w0[c], w1[c]);
        for (int r = 0; r < MR; ++r) {
          const __m512 x0 = _mm512_loadu_ps(x + r * K + b * kBlock), x1 = _mm512_loadu_ps(x + r * K + b * kBlock + 16);
          for (int c = 0; c < CR; ++c) acc[r][c] = _mm512_fmadd_ps(w1[c], x1, _mm512_fmadd_ps(w0[c], x0, acc[r][c]));
        }
      }
    }
    // sums: four at a time, (row r: W rows c0 .. c0 + 3) or, CR = 2, (rows r and r + 1: W rows c0, c0 + 1)
    const int64_t valid = std::min<int64_t>(CR, N - n - c0);  // W rows of this pass inside N
    for (int r = 0; r < MR; r += 4 / CR) {
      const __m512 zero = _mm512_setzero_ps();
      const bool pair = CR == 2 && r + 1 < MR;
      alignas(16) float sums[4];
      _mm_store_ps(sums, CR == 4 ? Sum4(acc[r][0], acc[r][1 % CR], acc[r][2 % CR], acc[r][3 % CR])
                                 : Sum4(acc[r][0], acc[r][1 % CR], pair ? acc[(r + 1) % MR][0] : zero,
                                        pair ? acc[(r + 1) % MR][1 % CR] : zero));
      for (int64_t c = 0; c < valid; ++c) {
        y[r * N + n + c0 + c] = sums[c];
        if (pair) y[(r + 1) * N + n + c0 + c] = sums[CR + c];
      }
    }
  }
}

// y[M, rows of groups g0 .. g1] = x[M, K] . those rows of W, M < 16 (gguf_linear's narrow path).
template <int64_t QT>
void NarrowGroups(const float* x, const uint8_t* w, int64_t M, int64_t K, int64_t N, int64_t g0, int64_t g1,
                  float* y) {
  const int64_t group_bytes = K / kBlock * FormatOf(QT).group_bytes;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* column = w + g * group_bytes;
    const int64_t n = g * kGroup;
    for (int64_t m = 0; m < M; m += kNarrowRows) {
      const float* xm = x + m * K;
      float* ym = y + m * N;
      switch (std::min<int64_t>(kNarrowRows, M - m)) {
        case 1: GroupRows<1, QT>(xm, column, K, N, n, m == 0, ym); break;
        case 2: GroupRows<2, QT>(xm, column, K, N, n, m == 0, ym); break;
        case 3: GroupRows<3, QT>(xm, column, K, N, n, m == 0, ym); break;
        case 4: GroupRows<4, QT>(xm, column, K, N, n, m == 0, ym); break;
        case 5: GroupRows<5, QT>(xm, column, K, N, n, m == 0, ym); break;
        case 6: GroupRows<6, QT>(xm, column, K, N, n, m == 0, ym); break;
        case 7: GroupRows<7, QT>(xm, column, K, N, n, m == 0, ym); break;
        default: GroupRows<8, QT>(xm, column, K, N, n, m == 0, ym); break;
      }
    }
  }
}

}  // namespace
#endif  // __AVX512F__
