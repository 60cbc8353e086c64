// gguf_linear's kernels for few rows of x (AVX-512), templates instantiated by gguf_linear.cc's
// dispatch: M < 4 (a decode of a few sequences) dequantizes each block in registers and uses it for
// every row of x; 4 <= M < 16 dequantizes a tile of W rows into a float32 buffer once and runs a
// register-blocked dot-product kernel over it.
// In an unnamed namespace, as when this code lived in gguf_linear.cc: internal to each file that
// includes it, so the compiler inlines it as before and the module exports none of it.
#pragma once
#ifdef __AVX512F__
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gguf_blocks.h"

namespace {

// M < 4: the 4 rows of each group at once (independent FMA chains hide the FMA latency), blocks
// dequantized in registers and used for each of the MR rows of x. Groups g0 .. g1, rows past N skipped.
template <int MR, int64_t QT>
void SmallGroups(const float* x, const uint8_t* w, int64_t K, int64_t N, int64_t g0, int64_t g1, float* y) {
  const Format f = FormatOf(QT);
  const int64_t blocks = K / kBlock;
  for (int64_t g = g0; g < g1; ++g) {
    __m512 acc[MR][kGroup];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < kGroup; ++c) acc[r][c] = _mm512_setzero_ps();
    const uint8_t* column = w + g * blocks * f.group_bytes;
    for (int64_t b = 0; b < blocks; ++b, column += f.group_bytes) {
      _mm_prefetch(reinterpret_cast<const char*>(column + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(column + kPrefetchBytes + 64), _MM_HINT_T0);
      if (f.group_bytes > 128) _mm_prefetch(reinterpret_cast<const char*>(column + kPrefetchBytes + 128), _MM_HINT_T0);
      const float* scales = reinterpret_cast<const float*>(column);
      __m512 x0[MR], x1[MR];
      for (int r = 0; r < MR; ++r) {
        x0[r] = _mm512_loadu_ps(x + r * K + b * kBlock);
        x1[r] = _mm512_loadu_ps(x + r * K + b * kBlock + 16);
      }
      for (int c = 0; c < kGroup; ++c) {
        __m512 w0, w1;
        DequantBlock<QT>(column + f.scale_bytes + c * f.quant_bytes, scales[c], QT == kQ4_1 ? scales[kGroup + c] : 0.f,
                         w0, w1);
        for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(w1, x1[r], _mm512_fmadd_ps(w0, x0[r], acc[r][c]));
      }
    }
    for (int c = 0; c < kGroup && g * kGroup + c < N; ++c)
      for (int r = 0; r < MR; ++r) y[r * N + g * kGroup + c] = _mm512_reduce_add_ps(acc[r][c]);
  }
}

// y[MR, NR] (row stride N) = x[MR, K] . wt[NR, K]^T, both float32 rows.
template <int MR, int NR>
void Micro(const float* x, const float* wt, int64_t K, float* y, int64_t N) {
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 xv[MR], wv[NR];
    for (int r = 0; r < MR; ++r) xv[r] = _mm512_loadu_ps(x + r * K + k);
    for (int c = 0; c < NR; ++c) wv[c] = _mm512_loadu_ps(wt + c * K + k);
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_fmadd_ps(xv[r], wv[c], acc[r][c]);
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) y[r * N + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int MR>
void MicroRows(const float* x, const float* wt, int64_t K, float* y, int64_t N, int64_t nr) {
  int64_t c = 0;
  for (; c + 4 <= nr; c += 4) Micro<MR, 4>(x, wt + c * K, K, y + c, N);
  for (; c < nr; ++c) Micro<MR, 1>(x, wt + c * K, K, y + c, N);
}

// 4 <= M < 16: tiles of kTileRows W rows dequantized once, reused by every row of x.
template <int64_t QT>
void LargeM(const float* x, const uint8_t* w, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y,
            std::vector<float>& tile) {
  const Format f = FormatOf(QT);
  const int64_t blocks = K / kBlock;
  tile.resize(kTileRows * K);
  for (int64_t t = n0; t < n1; t += kTileRows) {
    const int64_t nr = std::min(kTileRows, n1 - t);
    for (int64_t j = 0; j < nr; ++j) DequantRow<QT>(w, f, blocks, t + j, 0, blocks, tile.data() + j * K);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) MicroRows<4>(x + m * K, tile.data(), K, y + m * N + t, N, nr);
    switch (M - m) {
      case 3: MicroRows<3>(x + m * K, tile.data(), K, y + m * N + t, N, nr); break;
      case 2: MicroRows<2>(x + m * K, tile.data(), K, y + m * N + t, N, nr); break;
      case 1: MicroRows<1>(x + m * K, tile.data(), K, y + m * N + t, N, nr); break;
      default: break;
    }
  }
}

}  // namespace
#endif  // __AVX512F__
