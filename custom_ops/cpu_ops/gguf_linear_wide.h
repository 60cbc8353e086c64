// gguf_linear's kernel for many rows of x (M >= 16, AVX-512) on any GGUF type, a template on the
// dequantization of a chunk of a W row (gguf_linear.cc's dispatch gives it): each dequantized weight broadcast against 16 rows of x transposed, K in
// L1-sized chunks, panels of W rows whose partial sums stay in L2 while the next panel is prefetched;
// and the transpose of x it reads.
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

// M >= kWideM: each dequantized weight is broadcast against 16 rows of x per vector. xt is x
// transposed, [K, Mp] with Mp = M rounded up to 16 (zero padded). K is cut into chunks of kChunk so
// that a chunk of xt stays in L1 while the W tiles of a panel (kPanelRows rows) pass over it;
// partial sums of a tile (kWideRows W rows x MV * 16 rows of x) live in `acc` between chunks.
constexpr int64_t kWideRows = 8;
constexpr int64_t kChunk = 256;       // a multiple of every block (32; the K-quants' 256)
constexpr int64_t kPanelRows = 256;   // W rows whose partial sums are kept between K chunks

template <int MV>
void BroadcastKernel(const float* xt, int64_t Mp, const float* tile, int64_t kc, float* acc_out, bool first) {
  // acc_out: [kWideRows][MV * 16]; tile: [kWideRows][kc]; xt: [kc][Mp] (this chunk)
  __m512 acc[kWideRows][MV];
  for (int j = 0; j < kWideRows; ++j)
    for (int v = 0; v < MV; ++v) acc[j][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_out + (j * MV + v) * 16);
  for (int64_t k = 0; k < kc; ++k) {
    __m512 xv[MV];
    for (int v = 0; v < MV; ++v) xv[v] = _mm512_loadu_ps(xt + k * Mp + v * 16);
    for (int j = 0; j < kWideRows; ++j) {
      const __m512 wj = _mm512_set1_ps(tile[j * kc + k]);
      for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_fmadd_ps(wj, xv[v], acc[j][v]);
    }
  }
  for (int j = 0; j < kWideRows; ++j)
    for (int v = 0; v < MV; ++v) _mm512_storeu_ps(acc_out + (j * MV + v) * 16, acc[j][v]);
}

// dequant(n, k0, kc, out): values k0 .. k0 + kc of W's row n into out (float32; k0 and kc whole blocks).
// row_bytes: bytes of W per row (the interleaved layout: a group's bytes / 4), rows in address order.
template <typename Dequant>
void WideM(const float* xt, int64_t Mp, const Dequant& dequant, const uint8_t* w, int64_t row_bytes, int64_t M,
           int64_t K, int64_t N, int64_t n0, int64_t n1, float* y, std::vector<float>& tile) {
  std::vector<float> acc(kPanelRows * 32);  // partial sums of one panel: per tile [kWideRows][32]
  tile.assign(kWideRows * kChunk, 0.f);     // rows past the end of W stay zero
  for (int64_t m = 0; m < M; m += 32) {
    const int64_t mv = std::min<int64_t>(32, M - m) > 16 ? 2 : 1, mr = std::min<int64_t>(32, M - m);
    for (int64_t p0 = n0; p0 < n1; p0 += kPanelRows) {  // a panel of W rows: its sums stay in L2
      const int64_t p1 = std::min(n1, p0 + kPanelRows), tiles = (p1 - p0 + kWideRows - 1) / kWideRows;
      // The next panel's weights (whole groups, so one contiguous range) are prefetched into L2, a
      // slice per tile step: the panel's own reads jump between groups (rows) and defeat the hardware
      // prefetcher (batch-32 decode layers: 10% faster here).
      const uint8_t* next = w + p1 * row_bytes;
      const int64_t next_bytes = std::min(n1 - p1, kPanelRows) / kGroup * kGroup * row_bytes;
      const int64_t steps = (K + kChunk - 1) / kChunk * tiles, slice = (next_bytes / steps + 63) / 64 * 64;
      int64_t step = 0;
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kc = std::min(kChunk, K - k0);
        for (int64_t t = 0; t < tiles; ++t, ++step) {
          for (int64_t b = step * slice; b < std::min(next_bytes, (step + 1) * slice); b += 64)
            _mm_prefetch(reinterpret_cast<const char*>(next + b), _MM_HINT_T1);
          const int64_t row0 = p0 + t * kWideRows, nr = std::min(kWideRows, p1 - row0);
          for (int64_t j = 0; j < nr; ++j)
            dequant(row0 + j, k0, kc, tile.data() + j * kc);
          float* a = acc.data() + t * kWideRows * 32;
          if (mv == 2) {
            BroadcastKernel<2>(xt + k0 * Mp + m, Mp, tile.data(), kc, a, k0 == 0);
          } else {
            BroadcastKernel<1>(xt + k0 * Mp + m, Mp, tile.data(), kc, a, k0 == 0);
          }
        }
      }
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t row0 = p0 + t * kWideRows, nr = std::min(kWideRows, p1 - row0);
        const float* a = acc.data() + t * kWideRows * 32;
        for (int64_t i = 0; i < mr; ++i)
          for (int64_t j = 0; j < nr; ++j) y[(m + i) * N + row0 + j] = a[j * mv * 16 + i];
      }
    }
  }
}

// xt[k, :] = x[:, k] for k in k0 .. k1, rows M .. Mp zero: one masked gather per 16 rows of x (the
// scalar strided copy cost 20-40 us per call at 32 rows, more than the arithmetic of a small layer).
inline void Transpose(const float* x, int64_t M, int64_t K, int64_t Mp, int64_t k0, int64_t k1, float* xt) {
  const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(static_cast<int>(K)));
  for (int64_t k = k0; k < k1; ++k)
    for (int64_t m = 0; m < Mp; m += 16) {
      const __mmask16 rows = M - m >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (M - m)) - 1);
      _mm512_storeu_ps(xt + k * Mp + m,
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rows, offsets, x + m * K + k, sizeof(float)));
    }
}

}  // namespace
#endif  // __AVX512F__
