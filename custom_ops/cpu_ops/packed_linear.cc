// Linear layer on packed bf16 / weight-only int8 / int4 weights, CPU, float32 activations in and out.
//
//   y[M, N] = act(x[M, K] @ W^T (+ bias))   (W [N, K] in packed_linear.h's layout, kind: packed::kBf16/kWint8/
//                                             kWint4; bias [N] float32, or zero-size for none; act: `activation`
//                                             0 none, 1 QuickGELU as vec_exp.h computes it, the fd_quick_gelu op's)
//   y[M, N] = silu(x @ Wg^T (+ bg)) * (x @ Wu^T (+ bu))   (`activation` 2, SwiGLU: an MLP's gate and up
//                                             projections, N = the intermediate size; W holds 2 N' rows,
//                                             N' = N rounded up to 32, so that panel p's 64 columns are gate
//                                             features 32 p..32 p + 31 then up features 32 p..32 p + 31, zero
//                                             past N; bias [2 N] as [bg | bu]; silu(g) * u as vec_exp.h's
//                                             SiluTimes, the fd_silu_and_mul op's)
//
// x is rounded to bf16 once per call; each product of two bf16 values is exact in float32 and the sum is
// float32 (AVX512-BF16's vdpbf16ps, AMX's tdpbf16ps, on CPUs that have them); where y is written, the
// float32 sums are multiplied by wint8's column scales, the bias added and the activation applied
// (Epilogue), so a layer with a bias and an activation makes one pass over y, not three (SwiGLU: an
// MLP's gate_up writes y once, half as wide, instead of a product then a separate activation pass). Paths:
//   * AVX512-BF16 (compiled when -march=native has it): register tiles of up to 6 rows of x by one panel of
//     64 columns (24 float32 accumulators); each k2 step loads the panel's 4 registers of W (bf16 as is,
//     int8/int4 converted to bf16 in registers) and broadcasts each row's bf16 pair of x. Up to 6 rows this
//     is the whole call (decode: W streams from memory once, at 2 / 1 / ~0.56 bytes per weight); int8 /
//     int4 at 7 and 8 rows where AMX is absent (a speculative step's verification), and wint8 from 3, run
//     one tile on half a panel's registers at a time (HalfTiles: W still streamed once, its registers
//     loaded and converted once); above,
//     where AMX is absent, int8/int4 panels are first converted to a bf16 panel in a per-thread buffer (in
//     L2), reused by every 6-row block. One row of x on wint8 (decode) runs Wint8Row instead: float32
//     FMAs on the int8 values widened to float32 and x's bf16 values widened back (the same products).
//   * AMX-BF16 (compiled when -march=native has it, on Linux; used from 7 rows when the kernel grants the
//     process the tile state): the bf16 panel is, as it is, the B operand of `tdpbf16ps` (16 pairs x 16
//     columns per tile: a panel row of 256 bytes holds four tiles' rows); x, rounded into a 64-byte aligned
//     buffer zero padded to 16 rows and to K a multiple of 32, gives A tiles of 16 rows x 32 values. Up to
//     64 rows (batched decode) blocks of 16 rows x 64 columns over all of K. Above (prefill), bound by L2
//     traffic: x in blocks of 256 rows, run over groups of panels (~4 MB) group by group, and in
//     each block K in chunks of 256 values, whose panel chunk stays in L1 while blocks of 32 rows x 32
//     columns (2 A, 2 B, 4 accumulator tiles) use it, the accumulators spilled to a float32 buffer
//     between chunks. Accumulators go through a per-thread buffer to y (Epilogue, padded columns cut).
//     int8/int4 panels, and bf16 ones when K is not a multiple of 32, are converted to a zero padded bf16
//     panel first.
//   * portable (no AVX512-BF16, or `portable` set, which the tests use): the same values in plain loops
//     over a float32 copy of one panel at a time.
// Threads take panels from an atomic counter, in runs of consecutive panels for decode (ClaimRun), one at a
// time for prefill (OpenMP `parallel` with the split by hand: see custom_ops/README.md, "OpenMP runtime"),
// when the call has enough work to pay for waking them.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <memory>
#include <tuple>
#include <vector>

#include "amx_tiles.h"  // FD_AMX: AMX-BF16 tiles compiled (with AVX512-BF16, on Linux)
#include "cpu_ops.h"
#include "packed_linear.h"
#include "vec_exp.h"
#include "paddle/extension.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {
using namespace packed;

constexpr int64_t kParallelMacs = 1 << 17;  // multiply-adds below which one thread is faster
constexpr int kMaxTileRows = 6;

using fd_cpu::Align64;  // amx_tiles.h

// The calling thread's team size (1 outside a parallel region, or without OpenMP).
inline int64_t TeamSize() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// The next run [first, last) of `total` work items for the calling thread, from `next` (shared by the
// team). Guided self-scheduling (Polychronopoulos and Kuck, 1987): a claim takes max(1, remaining / (2
// threads)) consecutive items, so a thread's panels lie mostly one after another in memory and its
// prefetches run on across their boundaries instead of each panel starting a stream cold, and the last
// claims are single panels (a thread the OS pauses delays one panel, not half the call). `single`: one
// item a claim.
struct Run {
  int64_t first, last;
};
inline Run ClaimRun(std::atomic<int64_t>& next, int64_t total, bool single) {
  const int64_t threads = TeamSize();
  int64_t first = next.load(std::memory_order_relaxed);
  while (first < total) {
    const int64_t size = single ? 1 : std::max<int64_t>(1, (total - first) / (2 * threads));
    if (next.compare_exchange_weak(first, first + size, std::memory_order_relaxed)) return {first, first + size};
  }
  return {total, total};
}

// x [M, K] float32 -> bf16 [M, ldx] (rows m0..m1; values K..ldx-1 of a row set to zero)
void RoundRows(const float* x, int64_t K, int64_t ldx, int64_t m0, int64_t m1, uint16_t* xb) {
  for (int64_t m = m0; m < m1; ++m) {
    fd_cpu::RoundRow(x + m * K, K, xb + m * ldx);
    std::fill(xb + m * ldx + K, xb + (m + 1) * ldx, uint16_t{0});
  }
}

constexpr int64_t kHalfPanel = kPanel / 2;  // SwiGLU: a panel's gate columns, then as many up columns

// Columns of y one panel writes: 64, or with SwiGLU 32 (its gate and up halves give one column each).
inline int64_t OutWidth(int64_t activation) { return activation == kSwiGlu ? kHalfPanel : kPanel; }

// Rows of W (output features as packed) for y's N columns.
inline int64_t WeightRows(int64_t activation, int64_t N) {
  return activation == kSwiGlu ? 2 * ((N + kHalfPanel - 1) / kHalfPanel * kHalfPanel) : N;
}

// What a panel's float32 sums become: times wint8's column scales, plus the layer's bias (nullptr where
// there is none; else the entries of the panel's columns 0-31 and 32-63: with SwiGLU, its gate and up
// features'), then the activation.
struct Epilogue {
  const float* scale;
  const float* bias_lo;
  const float* bias_hi;
  int64_t activation;
};

// Panel p's Epilogue for a y of N columns: wint8's column scales (packed_linear.h ColumnScales), the bias.
inline Epilogue EpilogueOf(const uint8_t* w, const Layout& l, int64_t kind, const float* bias, int64_t activation,
                           int64_t N, int64_t p) {
  const float *lo = nullptr, *hi = nullptr;
  if (bias && activation == kSwiGlu) {  // bias is [gate | up], N each
    lo = bias + p * kHalfPanel;
    hi = bias + N + p * kHalfPanel;
  } else if (bias) {
    lo = bias + p * kPanel;
    hi = lo + kHalfPanel;
  }
  return {ColumnScales(w, l, kind, p), lo, hi, activation};
}

// Column c of a panel's sums, scaled and biased (the portable path's; Finish below is the vector one).
inline float Biased(float sum, const Epilogue& out, int64_t c) {
  const float product = out.scale ? sum * out.scale[c] : sum;
  if (!out.bias_lo) return product;
  return product + (c < kHalfPanel ? out.bias_lo[c] : out.bias_hi[c - kHalfPanel]);
}

// y's column c (< OutWidth) of a panel from its 64 sums `acc`.
inline float FinishOne(const float* acc, const Epilogue& out, int64_t c) {
  if (out.activation == kSwiGlu)
    return fd_cpu::SiluTimes(Biased(acc[c], out, c), Biased(acc[c + kHalfPanel], out, c + kHalfPanel));
  const float biased = Biased(acc[c], out, c);
  return out.activation == kQuickGelu ? fd_cpu::QuickGelu(biased) : biased;
}

// ---- portable path ---------------------------------------------------------------------------------
void PortablePanel(const uint16_t* xb, int64_t M, int64_t K, const uint8_t* w, const Layout& l, int64_t kind,
                   int64_t p, int64_t N, const Epilogue& out, float* y, std::vector<float>& tile) {
  tile.resize(K * kPanel);  // [K, 64] float32 values of this panel
  for (int64_t k2 = 0; k2 < l.k2; ++k2)
    for (int64_t lane = 0; lane < 2 * kPanel; ++lane)
      tile[(2 * k2 + lane % 2) * kPanel + lane / 2] = PackedValue(w, l, kind, p, k2, lane);
  const int64_t width = OutWidth(out.activation), cols = std::min(width, N - p * width);
  float acc[kPanel];
  for (int64_t m = 0; m < M; ++m) {
    std::fill(acc, acc + kPanel, 0.f);
    for (int64_t k = 0; k < K; ++k) {
      const float xv = Bf16ToFloat(xb[m * K + k]);
      const float* row = tile.data() + k * kPanel;
#pragma omp simd
      for (int64_t c = 0; c < kPanel; ++c) acc[c] += xv * row[c];
    }
    for (int64_t c = 0; c < cols; ++c) y[m * N + p * width + c] = FinishOne(acc, out, c);
  }
}

#ifdef __AVX512BF16__
// ---- AVX512-BF16 path -------------------------------------------------------------------------------
inline __m512bh AsBh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

// Columns 16 j .. 16 j + 15 (those in `mask`) of a panel's sums, scaled, biased and, for QuickGELU,
// activated (Epilogue; SwiGLU pairs two of these in StoreRow).
inline __m512 Finish(__m512 sums, const Epilogue& out, int j, __mmask16 mask) {
  if (out.scale) sums = _mm512_mul_ps(sums, _mm512_maskz_loadu_ps(mask, out.scale + 16 * j));
  if (out.bias_lo) {
    const float* bias = j < 2 ? out.bias_lo + 16 * j : out.bias_hi + 16 * (j - 2);
    sums = _mm512_add_ps(sums, _mm512_maskz_loadu_ps(mask, bias));
  }
  return out.activation == kQuickGelu ? fd_cpu::QuickGelu(sums) : sums;
}

// The first `cols` of 16 columns from 16 j.
inline __mmask16 ColumnMask(int64_t cols, int j) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(cols - 16 * j, 0, 16)) - 1u);
}

// One row of a panel's sums (4 registers, its 64 columns) into y's row at the panel's first column:
// Finish, and with SwiGLU silu(gate) * up of columns c and 32 + c; `cols` of OutWidth columns are y's.
// `stream` (all OutWidth columns, y 64-byte aligned): non-temporal stores.
// Register j (columns 16 j .. 16 j + 15) of a row's sums into y as StoreRow does; with SwiGLU (j < 2)
// `up` is the row's register j + 2, the up features of the gate features in `sum`.
inline void StoreRegister(__m512 sum, __m512 up, const Epilogue& out, int64_t cols, int j, float* y, bool stream) {
  const __mmask16 mask = ColumnMask(cols, j);
  __m512 v = Finish(sum, out, j, mask);
  if (out.activation == kSwiGlu) v = fd_cpu::SiluTimes(v, Finish(up, out, j + 2, mask));
  if (stream) {
    _mm512_stream_ps(y + 16 * j, v);
  } else {
    _mm512_mask_storeu_ps(y + 16 * j, mask, v);
  }
}

inline void StoreRow(const __m512* sums, const Epilogue& out, int64_t cols, float* y, bool stream) {
  const bool swiglu = out.activation == kSwiGlu;
  for (int j = 0; j < (swiglu ? 2 : 4); ++j) {
    const __mmask16 mask = ColumnMask(cols, j);
    __m512 v = Finish(sums[j], out, j, mask);
    if (swiglu) v = fd_cpu::SiluTimes(v, Finish(sums[j + 2], out, j + 2, mask));
    if (stream) {
      _mm512_stream_ps(y + 16 * j, v);
    } else {
      _mm512_mask_storeu_ps(y + 16 * j, mask, v);
    }
  }
}

// y[M, panel's columns] = acc[M, 64] as y holds them (StoreRow), row by row: each row's 256 (SwiGLU:
// 128) bytes of y are one run of memory. `stream` (a y of kStreamBytes or more: a prefill's, a batch's
// logits): a whole panel's rows go out with non-temporal stores (when y's rows are 64-byte aligned):
// each row's bytes fill their cache lines whole, so they need no read for ownership, and such a y
// outgrows the cores' L2 anyway (benchmarks/README.md at commit 9c89004, "Decode attention on AMX tiles"). The caller
// fences them before its threads meet.
void StoreRows(const float* acc, int64_t M, const Epilogue& out, int64_t cols, float* y, int64_t ldy, bool stream) {
  stream = stream && cols == OutWidth(out.activation) && reinterpret_cast<uintptr_t>(y) % 64 == 0 && ldy % 16 == 0;
  for (int64_t m = 0; m < M; ++m) {
    const __m512 sums[4] = {_mm512_loadu_ps(acc + m * kPanel), _mm512_loadu_ps(acc + m * kPanel + 16),
                            _mm512_loadu_ps(acc + m * kPanel + 32), _mm512_loadu_ps(acc + m * kPanel + 48)};
    StoreRow(sums, out, cols, y + m * ldy, stream);
  }
}

// Register `reg` (16 columns x 2) of pair k2 of a panel, as 32 bf16.
template <int64_t KIND>
inline __m512bh LoadW(const uint8_t* panel, const float* panel_scales, int64_t k2, int reg) {
  if constexpr (KIND == kBf16) {
    return AsBh(_mm512_loadu_si512(panel + (k2 * 128 + reg * 32) * 2));
  } else if constexpr (KIND == kWint8) {
    const int8_t* q = reinterpret_cast<const int8_t*>(panel) + k2 * 128 + reg * 32;
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
    const __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
    return _mm512_cvtne2ps_pbh(hi, lo);
  } else {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + k2 * 64 + reg * 16)));
    const __m512 qlo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    const __m512 qhi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    const float* dm = panel_scales + (2 * k2 / kInt4Group) * 2 * kPanel + reg * 16;  // this register's 16 columns
    const __m512 d = _mm512_loadu_ps(dm), m = _mm512_loadu_ps(dm + kPanel);
    const __m512i lo_cols = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);  // lane -> column
    const __m512i hi_cols = _mm512_add_epi32(lo_cols, _mm512_set1_epi32(8));
    const __m512 lo = _mm512_fmadd_ps(qlo, _mm512_permutexvar_ps(lo_cols, d), _mm512_permutexvar_ps(lo_cols, m));
    const __m512 hi = _mm512_fmadd_ps(qhi, _mm512_permutexvar_ps(hi_cols, d), _mm512_permutexvar_ps(hi_cols, m));
    return _mm512_cvtne2ps_pbh(hi, lo);
  }
}

// y[MR rows, panel columns] (+)= xb[MR rows] . panel over pairs k0..k1 (xb as bf16 pairs, row stride K2
// pairs). FIRST: start from zero, else from y; LAST: write y as StoreRow does (`cols` of its OutWidth
// columns), else the raw sums (`cols` of 64). STREAM: W comes from memory once (decode), so prefetch it
// kPrefetchBytes ahead.
constexpr int64_t kPrefetchBytes = 2048;

template <int MR, int64_t KIND, bool STREAM>
__attribute__((noinline)) void Tile(const uint32_t* xb, int64_t K2, int64_t k0, int64_t k1, const uint8_t* panel, const float* panel_scales,
          const Epilogue& out, int64_t cols, bool first, bool last, float* y, int64_t ldy) {
  constexpr int64_t kPairBytes = KIND == kBf16 ? 256 : KIND == kWint8 ? 128 : 64;
  __m512 acc[MR][4];
  __mmask16 masks[4];
  for (int j = 0; j < 4; ++j) masks[j] = ColumnMask(cols, j);
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j)
      acc[m][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(masks[j], y + m * ldy + 16 * j);
  int64_t k2 = k0;
  if constexpr (MR == 1) {  // one row: 4 accumulator chains are latency-bound; run 8 (two pairs per step)
    __m512 odd[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (; k2 + 2 <= k1; k2 += 2) {
      if constexpr (STREAM) {
        for (int64_t line = 0; line < 2 * kPairBytes; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(panel + k2 * kPairBytes + kPrefetchBytes + line), _MM_HINT_T0);
      }
      const __m512bh a0 = AsBh(_mm512_set1_epi32(static_cast<int>(xb[k2])));
      const __m512bh a1 = AsBh(_mm512_set1_epi32(static_cast<int>(xb[k2 + 1])));
      for (int j = 0; j < 4; ++j) {
        acc[0][j] = _mm512_dpbf16_ps(acc[0][j], a0, LoadW<KIND>(panel, panel_scales, k2, j));
        odd[j] = _mm512_dpbf16_ps(odd[j], a1, LoadW<KIND>(panel, panel_scales, k2 + 1, j));
      }
    }
    for (int j = 0; j < 4; ++j) acc[0][j] = _mm512_add_ps(acc[0][j], odd[j]);
  }
  for (; k2 < k1; ++k2) {
    if constexpr (STREAM) {
      for (int64_t line = 0; line < kPairBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(panel + k2 * kPairBytes + kPrefetchBytes + line), _MM_HINT_T0);
    }
    __m512bh b[4];
    for (int j = 0; j < 4; ++j) b[j] = LoadW<KIND>(panel, panel_scales, k2, j);
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = AsBh(_mm512_set1_epi32(static_cast<int>(xb[m * K2 + k2])));
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], a, b[j]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    if (last) {
      StoreRow(acc[m], out, cols, y + m * ldy, false);
    } else {
      for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(y + m * ldy + 16 * j, masks[j], acc[m][j]);
    }
  }
}

template <int64_t KIND, bool STREAM>
void RowBlocks(const uint32_t* xb, int64_t M, int64_t K2, int64_t k0, int64_t k1, const uint8_t* panel,
               const float* panel_scales, const Epilogue& out, int64_t cols, bool first, bool last, float* y,
               int64_t ldy) {
  for (int64_t m = 0; m < M; m += kMaxTileRows) {
    const uint32_t* xm = xb + m * K2;
    float* ym = y + m * ldy;
    const auto args = std::make_tuple(xm, K2, k0, k1, panel, panel_scales, std::cref(out), cols, first, last, ym, ldy);
    switch (std::min<int64_t>(kMaxTileRows, M - m)) {
      case 1: std::apply(Tile<1, KIND, STREAM>, args); break;
      case 2: std::apply(Tile<2, KIND, STREAM>, args); break;
      case 3: std::apply(Tile<3, KIND, STREAM>, args); break;
      case 4: std::apply(Tile<4, KIND, STREAM>, args); break;
      case 5: std::apply(Tile<5, KIND, STREAM>, args); break;
      default: std::apply(Tile<6, KIND, STREAM>, args); break;
    }
  }
}

// y[MR rows, panel columns] = xb[MR rows] . panel over all pairs, MR <= kHalfTileRows rows (a speculative
// step's verification where AMX is absent; wint8 from 3 rows, wint4 from 7; not bf16, whose 7-8 rows ran
// faster as the blocks of Panels' prefill path): a Tile on half the
// panel's registers at a time (j = h and h + 2: with SwiGLU a gate register and its up register), MR x 2
// accumulators, so that 8 rows fit in registers and int8's conversion leaves registers free; the first
// half streams W from memory (prefetched as Tile's STREAM), the second finds it in L2. Each W register is
// loaded (int8 / int4: converted) once, as in one Tile of all rows. Tile and HalfTiles stay out of line:
// inlined into one caller, they cost Tile's 4-6 row registers (bf16 at 6 rows ~1.7x slower here).
constexpr int kHalfTileRows = 8;

template <int MR, int64_t KIND>
__attribute__((noinline)) void HalfTiles(const uint32_t* xb, int64_t K2, const uint8_t* panel, const float* panel_scales, const Epilogue& out,
               int64_t cols, float* y, int64_t ldy) {
  constexpr int64_t kPairBytes = KIND == kBf16 ? 256 : KIND == kWint8 ? 128 : 64;
  for (int h = 0; h < 2; ++h) {
    __m512 acc[MR][2];
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    for (int64_t k2 = 0; k2 < K2; ++k2) {
      if (h == 0)
        for (int64_t line = 0; line < kPairBytes; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(panel + k2 * kPairBytes + kPrefetchBytes + line), _MM_HINT_T0);
      const __m512bh b0 = LoadW<KIND>(panel, panel_scales, k2, h), b1 = LoadW<KIND>(panel, panel_scales, k2, h + 2);
      for (int m = 0; m < MR; ++m) {
        const __m512bh a = AsBh(_mm512_set1_epi32(static_cast<int>(xb[m * K2 + k2])));
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], a, b0);
        acc[m][1] = _mm512_dpbf16_ps(acc[m][1], a, b1);
      }
    }
    for (int m = 0; m < MR; ++m) {
      if (out.activation == kSwiGlu) {
        StoreRegister(acc[m][0], acc[m][1], out, cols, h, y + m * ldy, false);
      } else {
        StoreRegister(acc[m][0], acc[m][0], out, cols, h, y + m * ldy, false);
        StoreRegister(acc[m][1], acc[m][1], out, cols, h + 2, y + m * ldy, false);
      }
    }
  }
}

// A panel's pairs 0..K2-1 as bf16 [K2, 128] (the bf16 panel layout), int8/int4 converted.
template <int64_t KIND>
void ToBf16Panel(const uint8_t* panel, const float* panel_scales, int64_t K2, uint16_t* out) {
  for (int64_t k2 = 0; k2 < K2; ++k2)
    for (int j = 0; j < 4; ++j) {
      const __m512bh v = LoadW<KIND>(panel, panel_scales, k2, j);
      _mm512_storeu_si512(out + k2 * 128 + j * 32, reinterpret_cast<const __m512i&>(v));
    }
}

// y[panel columns] = x . panel for one row of x and a wint8 panel (decode's GEMV), in float32 FMAs:
// per pair k2, the panel's 128 int8 values widen to float32 (exact) in 8 registers, each multiplied by
// the broadcast pair (x[2 k2], x[2 k2 + 1]) of bf16-rounded x widened to float32 (xf), so every
// product is the exact product the bf16 kernels form; lane 2c + t of the 8 accumulators sums column
// c's products with x[2 k2 + t], the two added at the end. Three vector operations per 16 weights
// instead of the int8 -> float32 -> bf16 conversion before `vdpbf16ps` (~3.5 for 16): the decode GEMV
// is bound by this arithmetic, not by memory, on int8. Two pairs per step (16 accumulators, independent
// chains); W prefetched kWint8RowPrefetch bytes ahead, farther than the bf16 tiles' kPrefetchBytes
// (both distances measured: benchmarks/README.md at commit 9c89004,
// "Quiet machine, side by side, Intel Xeon with AMX").
constexpr int64_t kWint8RowPrefetch = 16384;

void Wint8Row(const float* xf, const int8_t* panel, int64_t K2, const Epilogue& out, int64_t cols, float* y) {
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  int64_t k2 = 0;
  for (; k2 + 2 <= K2; k2 += 2) {
    const int8_t* q = panel + k2 * 128;
    for (int64_t line = 0; line < 256; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(q + kWint8RowPrefetch + line), _MM_HINT_T0);
    const __m512 x0 = _mm512_castpd_ps(_mm512_set1_pd(*reinterpret_cast<const double*>(xf + 2 * k2)));
    const __m512 x1 = _mm512_castpd_ps(_mm512_set1_pd(*reinterpret_cast<const double*>(xf + 2 * k2 + 2)));
    for (int r = 0; r < 8; ++r) {
      const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + r * 16));
      const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 128 + r * 16));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), x0, acc[r]);
      acc[8 + r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), x1, acc[8 + r]);
    }
  }
  if (k2 < K2) {  // an odd last pair
    const int8_t* q = panel + k2 * 128;
    const __m512 x0 = _mm512_castpd_ps(_mm512_set1_pd(*reinterpret_cast<const double*>(xf + 2 * k2)));
    for (int r = 0; r < 8; ++r)
      acc[r] = _mm512_fmadd_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + r * 16)))),
          x0, acc[r]);
  }
  // register r's lanes are columns 8 r .. 8 r + 7, (t = 0, t = 1) each: add the pairs, 16 columns per two registers
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __m512 sums[4];
  for (int j = 0; j < 4; ++j) {
    const __m512 a = _mm512_add_ps(acc[2 * j], acc[8 + 2 * j]), b = _mm512_add_ps(acc[2 * j + 1], acc[9 + 2 * j]);
    sums[j] = _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
  }
  StoreRow(sums, out, cols, y, false);
}

// Up to kHalfTileRows rows (decode, verification): panels of W taken in runs from `next` (ClaimRun), one
// tile per panel (HalfTiles: wint8 3-8 rows, wint4 7-8; bf16 up to kMaxTileRows) over all of K, W streamed once (its prefetches reach into the run's next panel). More (prefill): work
// items (block of rows of x, panel) taken one at a time from `next`, block-major, so a block of x (about
// kXBlockBytes of bf16) stays in L2 while every panel passes and W streams from L3 once per block, instead
// of all of x streaming once per panel (4096 x 768 x 3072 on 2 AMD EPYC Zen 4 cores without AMX: 131 GFLOP/s
// before, 147 after, 512 rows ~190: benchmarks/README.md, "benchmark_embed.py: embeddings"). Within an
// item, pairs in chunks of kChunkPairs (the chunk of a bf16 panel, 16 KB, stays in L1 while every tile of
// the block uses it), the partial sums kept in y (with SwiGLU, whose y holds half the columns, in a per-thread [block, 64] buffer,
// finished into y after the last chunk); int8/int4 panels are converted to a bf16 panel first (in L2).
constexpr int64_t kChunkPairs = 64;
constexpr int64_t kXBlockBytes = 512 << 10;

// Rows of x per block: kXBlockBytes of bf16 x, in whole tiles, 48 to 510 rows.
inline int64_t RowBlock(int64_t K2) {
  const int64_t rows = kXBlockBytes / (4 * K2) / kMaxTileRows * kMaxTileRows;
  return std::clamp<int64_t>(rows, 8 * kMaxTileRows, 85 * kMaxTileRows);
}

template <int64_t KIND>
void Panels(const uint32_t* xb, const float* xf, int64_t M, int64_t K2, const uint8_t* w, const Layout& l, int64_t N,
            const float* bias, int64_t activation, std::atomic<int64_t>& next, float* y) {
  const float* all_scales = reinterpret_cast<const float*>(w + l.WeightBytes());
  const bool swiglu = activation == kSwiGlu;
  const int64_t width = OutWidth(activation);
  if (M <= (KIND == kBf16 ? kMaxTileRows : kHalfTileRows)) {  // bf16 at 7-8 rows: the blocks below were faster
    for (Run run = ClaimRun(next, l.panels, false); run.first < run.last; run = ClaimRun(next, l.panels, false))
    for (int64_t p = run.first; p < run.last; ++p) {
      const uint8_t* panel = w + p * l.panel_bytes;
      const float* panel_scales = all_scales + p * l.scale_floats_per_panel;
      const Epilogue out = EpilogueOf(w, l, KIND, bias, activation, N, p);
      const int64_t cols = std::min(width, N - p * width);
      if (KIND == kWint8 && M == 1) {
        Wint8Row(xf, reinterpret_cast<const int8_t*>(panel), K2, out, cols, y + p * width);
      } else if (M < (KIND == kWint8 ? 3 : kMaxTileRows + 1)) {
        RowBlocks<KIND, true>(xb, M, K2, 0, K2, panel, panel_scales, out, cols, true, true, y + p * width, N);
      } else {
        const auto args = std::make_tuple(xb, K2, panel, panel_scales, std::cref(out), cols, y + p * width, N);
        switch (M) {
          case 3: std::apply(HalfTiles<3, KIND>, args); break;
          case 4: std::apply(HalfTiles<4, KIND>, args); break;
          case 5: std::apply(HalfTiles<5, KIND>, args); break;
          case 6: std::apply(HalfTiles<6, KIND>, args); break;
          case 7: std::apply(HalfTiles<7, KIND>, args); break;
          default: std::apply(HalfTiles<8, KIND>, args); break;
        }
      }
    }
    return;
  }
  const int64_t block = RowBlock(K2), items = (M + block - 1) / block * l.panels;
  std::vector<uint16_t> bf16_panel(KIND != kBf16 ? K2 * 128 : 0);
  std::vector<float> sums(swiglu ? block * kPanel : 0);  // [block, 64]
  for (int64_t item = next++; item < items; item = next++) {
    const int64_t p = item % l.panels, r0 = item / l.panels * block, rows = std::min(block, M - r0);
    const uint8_t* panel = w + p * l.panel_bytes;
    const Epilogue out = EpilogueOf(w, l, KIND, bias, activation, N, p);
    const int64_t cols = std::min(width, N - p * width);
    if constexpr (KIND != kBf16) {
      ToBf16Panel<KIND>(panel, all_scales + p * l.scale_floats_per_panel, K2, bf16_panel.data());
      panel = reinterpret_cast<const uint8_t*>(bf16_panel.data());
    }
    float* yp = y + r0 * N + p * width;
    // the partial sums' home: y, or with SwiGLU the [block, 64] buffer, finished into y after the last chunk
    float* partial = swiglu ? sums.data() : yp;
    const int64_t ld = swiglu ? kPanel : N, partial_cols = swiglu ? kPanel : cols;
    for (int64_t k0 = 0; k0 < K2; k0 += kChunkPairs) {
      const int64_t k1 = std::min(K2, k0 + kChunkPairs);
      RowBlocks<kBf16, false>(xb + r0 * K2, rows, K2, k0, k1, panel, nullptr, out, partial_cols, k0 == 0,
                              !swiglu && k1 == K2, partial, ld);
    }
    if (swiglu) StoreRows(sums.data(), rows, out, cols, yp, N, false);
  }
}

#ifdef FD_AMX
// ---- AMX-BF16 path ----------------------------------------------------------------------------------
// Eight tiles, each 16 rows x 64 bytes: 0-3 accumulators (16 rows x 16 float32 columns), 4-5 x (16 rows
// x 32 bf16 values of K: one step), 6-7 W (16 pairs x the 16 columns' bf16 pairs: 64 bytes of 16 panel
// rows, read at the panel's row stride of 256 bytes; the packed layout is the tile's pair layout).
// `_tile_dpbf16ps` adds the products of each pair into float32.
constexpr int64_t kAmxRows = 16, kAmxStepK = 32;  // rows of a tile; values of K per step (16 pairs)
constexpr int64_t kAmxMinRows = 7;  // fewer rows: the AVX512-BF16 tiles (W streamed once)
// Up to this many rows (batched decode) every 16-row block runs Amx16Rows over all of K, which reads each
// 256-byte panel row whole, so the first block streams the panel from memory in address order (the others
// find it in L2); reading half of each row per pass streamed slower (benchmarks/README.md at commit 9c89004, "Quiet
// machine, side by side, Intel Xeon with AMX"). Above, prefill: AmxManyRows, bound by the traffic from L2 to L1
// rather than by `tdpbf16ps`, so blocked for L1 (K in chunks), L2 (x in blocks of rows) and L3 (panel groups).
constexpr int64_t kAmxManyRowsFrom = 64;
constexpr int64_t kAmxPrefetchBytes = 6144;  // Amx16Rows' prefetch distance in W (1.5 steps)
constexpr int64_t kAmxChunkSteps = 8;  // AmxManyRows' chunk of K: 8 steps, 256 values, 32 KB of a bf16 panel
// Above kAmxManyRowsFrom rows a work item is (block of 256 rows of x, panel), and the panels go in groups of
// about 4 MB of bf16 W: every block runs over one group before the next group starts, so each panel comes
// from memory once and is reused from L3 by the other blocks, and a block's x chunks from L2 / L3 (fewer
// rows per block, sized for L2 whatever K, re-read large-K panels more often and were slower:
// benchmarks/README.md at commit 9c89004, "AMX prefill: 256-row blocks, panel groups").
constexpr int64_t kAmxBlockRows = 256, kAmxGroupBytes = 4 << 20;
// A y of this many bytes or more is stored with non-temporal stores (StoreRows): twice a core's L2, so it
// is not read back from L2 by the next op anyway (ERNIE-0.3B: a prefill's outputs, a decode batch's
// logits from 10 rows; not a decode layer's outputs).
constexpr int64_t kStreamBytes = 4 << 20;

using fd_amx::AmxPermitted;  // amx_tiles.h
using fd_amx::ConfigureTiles;

// acc[16 rows, 64 columns] = x[16 rows] . panel over all `steps` (as Amx32x32): one x tile, the four 16-column
// groups in turn. STREAM (the pass that reads the panel from memory): every line of the step
// kAmxPrefetchBytes ahead, up to `end` (the end of the thread's run of panels), is prefetched into L1
// first. A tile load cannot start before the `tdpbf16ps` that last read its tile register, so without it
// only the hardware prefetchers keep memory busy (benchmarks/README.md at commit 9c89004, "Weight stream prefetched").
template <bool STREAM>
void Amx16Rows(const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t steps, float* acc,
               const char* end = nullptr) {
  constexpr int64_t kStepBytes = 16 * 128 * sizeof(uint16_t);  // W per step: 16 pairs x 64 columns
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    const uint16_t* w = panel + s * 16 * 128;
    const char* ahead = reinterpret_cast<const char*>(w) + kAmxPrefetchBytes;
    if (STREAM && ahead < end)
      for (int64_t line = 0; line < kStepBytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
    _tile_loadd(4, x + s * kAmxStepK, ldx * 2);
    _tile_loadd(6, w, 256);
    _tile_loadd(7, w + 32, 256);
    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(6, w + 64, 256);
    _tile_loadd(7, w + 96, 256);
    _tile_dpbf16ps(2, 4, 6); _tile_dpbf16ps(3, 4, 7);
  }
  _tile_stored(0, acc, 256); _tile_stored(1, acc + 16, 256);
  _tile_stored(2, acc + 32, 256); _tile_stored(3, acc + 48, 256);
}

// acc[32 rows, 32 columns] (+)= x[32 rows] . the 32 panel columns at w, over steps s0..s1 (x: bf16 rows at
// a stride of ldx values; w: bf16 [pairs, 128] from its first column; acc: float32 rows of 64). FIRST: the
// accumulator tiles start from zero, else from acc. 2 x 2 tiles: each tile load feeds two `tdpbf16ps`.
template <bool FIRST>
void Amx32x32(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t s0, int64_t s1, float* acc) {
  if (FIRST) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  } else {
    _tile_loadd(0, acc, 256); _tile_loadd(1, acc + 16, 256);
    _tile_loadd(2, acc + 16 * kPanel, 256); _tile_loadd(3, acc + 16 * kPanel + 16, 256);
  }
  for (int64_t s = s0; s < s1; ++s) {
    const uint16_t* ws = w + s * 16 * 128;  // pairs 16 s..16 s + 15
    _tile_loadd(4, x + s * kAmxStepK, ldx * 2);
    _tile_loadd(6, ws, 256);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, x + 16 * ldx + s * kAmxStepK, ldx * 2);
    _tile_dpbf16ps(2, 5, 6);
    _tile_loadd(7, ws + 32, 256);
    _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, acc, 256); _tile_stored(1, acc + 16, 256);
  _tile_stored(2, acc + 16 * kPanel, 256); _tile_stored(3, acc + 16 * kPanel + 16, 256);
}

// acc[rows, 64] = x[rows] . panel over all `steps`, rows a multiple of 16 (prefill: many rows). K in
// chunks of kAmxChunkSteps steps: the panel's chunk (32 KB) stays in L1 while every 32-row block uses it,
// and a block's x chunk (16 KB) while both 32-column halves use it; the accumulators stay in tiles through
// a chunk and go through acc between chunks. A last block of 16 rows runs Amx16Rows.
void AmxManyRows(const uint16_t* x, int64_t ldx, int64_t rows, const uint16_t* panel, int64_t steps, float* acc) {
  const int64_t rows32 = rows / 32 * 32;
  for (int64_t s0 = 0; s0 < steps; s0 += kAmxChunkSteps) {
    const int64_t s1 = std::min(steps, s0 + kAmxChunkSteps);
    for (int64_t r = 0; r < rows32; r += 32)
      for (int64_t half = 0; half < 2; ++half) {
        float* c = acc + r * kPanel + 32 * half;
        if (s0 == 0)
          Amx32x32<true>(x + r * ldx, ldx, panel + 64 * half, s0, s1, c);
        else
          Amx32x32<false>(x + r * ldx, ldx, panel + 64 * half, s0, s1, c);
      }
  }
  if (rows32 < rows) Amx16Rows<false>(x + rows32 * ldx, ldx, panel, steps, acc + rows32 * kPanel);
}

// Panels from `next`, as Panels, with AMX tiles. xb: bf16 [M rounded up to 16, ldx], ldx = K rounded up
// to 32, zero padded. Above kAmxManyRowsFrom rows the work items are (block of kAmxBlockRows rows, panel),
// taken one at a time, group of panels by group, block by block in a group (both threads on one block of
// x); up to it, one block of all rows, panels taken in runs (ClaimRun). int8/int4 panels, and bf16 ones
// when K is not a multiple of 32, are first written as a bf16 panel into a per-thread buffer whose pairs
// past K / 2 stay zero (no tile reads past K), once per work item.
template <int64_t KIND>
void AmxPanels(const uint16_t* xb, int64_t M, int64_t ldx, int64_t K2, const uint8_t* w, const Layout& l,
               int64_t N, const float* bias, int64_t activation, std::atomic<int64_t>& next, float* y) {
  const int64_t rows = (M + kAmxRows - 1) / kAmxRows * kAmxRows, steps = ldx / kAmxStepK;
  const bool many = rows > kAmxManyRowsFrom;
  const int64_t block = many ? kAmxBlockRows : rows, blocks = (rows + block - 1) / block, items = blocks * l.panels;
  const int64_t group = many ? std::clamp<int64_t>(kAmxGroupBytes / (ldx * 2 * kPanel), 1, l.panels) : l.panels;
  const bool copy = KIND != kBf16 || 2 * K2 != ldx;
  const bool stream = M * N * static_cast<int64_t>(sizeof(float)) >= kStreamBytes;  // StoreRows
  const int64_t width = OutWidth(activation);
  std::vector<uint16_t> bf16_buffer(copy ? ldx * kPanel + 32 : 0);
  std::unique_ptr<float[]> acc_buffer(new float[block * kPanel + 16]);  // written before it is read
  uint16_t* bf16_panel = Align64(bf16_buffer.data());  // [ldx / 2 pairs, 128]
  float* acc = Align64(acc_buffer.get());              // [block, 64]
  const float* all_scales = reinterpret_cast<const float*>(w + l.WeightBytes());
  ConfigureTiles();
  for (Run run = ClaimRun(next, items, many); run.first < run.last; run = ClaimRun(next, items, many))
  for (int64_t item = run.first; item < run.last; ++item) {
    // item -> (group of panels, block of rows, panel of the group): every block runs over a group before the next
    const int64_t first = item / (blocks * group) * group, size = std::min(group, l.panels - first);
    const int64_t in_group = item - first * blocks;
    const int64_t p = first + in_group % size, r0 = in_group / size * block, block_rows = std::min(block, rows - r0);
    const float* panel_scales = all_scales + p * l.scale_floats_per_panel;
    const uint16_t* panel = reinterpret_cast<const uint16_t*>(w + p * l.panel_bytes);
    if (copy) {
      ToBf16Panel<KIND>(w + p * l.panel_bytes, panel_scales, K2, bf16_panel);
      panel = bf16_panel;
    }
    if (many)
      AmxManyRows(xb + r0 * ldx, ldx, block_rows, panel, steps, acc);
    else
      for (int64_t r = 0; r < rows; r += kAmxRows) {
        if (r == 0 && !copy)  // the first block streams W from memory, the others find it in L2
          Amx16Rows<true>(xb, ldx, panel, steps, acc, reinterpret_cast<const char*>(w + run.last * l.panel_bytes));
        else
          Amx16Rows<false>(xb + r * ldx, ldx, panel, steps, acc + r * kPanel);
      }
    const Epilogue out = EpilogueOf(w, l, KIND, bias, activation, N, p);
    StoreRows(acc, std::min(block_rows, M - r0), out, std::min(width, N - p * width), y + r0 * N + p * width, N,
              stream);
  }
  _mm_sfence();  // StoreRows' non-temporal stores reach memory before the team's barrier
  _tile_release();
}
#endif
#endif

}  // namespace

std::vector<paddle::Tensor> PackedLinear(const paddle::Tensor& x, const paddle::Tensor& weight,
                                         const paddle::Tensor& bias, int64_t kind, int64_t out_features,
                                         bool portable, int64_t activation) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32, "packed_linear: x must be float32 on CPU");
  PD_CHECK(KnownKind(kind), "packed_linear: kind must be ", kBf16, " (bf16), ", kWint8, " (wint8) or ", kWint4,
           " (wint4), got ", kind);
  PD_CHECK(activation == kNoActivation || activation == kQuickGelu || activation == kSwiGlu,
           "packed_linear: activation must be ", kNoActivation, " (none), ", kQuickGelu, " (quick_gelu) or ", kSwiGlu,
           " (swiglu), got ", activation);
  const int64_t K = x.shape().back(), M = x.numel() / K, N = out_features, rows_w = WeightRows(activation, N);
  const Layout l = LayoutOf(kind, rows_w, K);
  PD_CHECK(K % 2 == 0 && (kind != kWint4 || K % kInt4Group == 0), "packed_linear: in_features ", K,
           " must be even (a multiple of ", kInt4Group, " for wint4)");
  PD_CHECK(weight.dtype() == paddle::DataType::UINT8 && weight.numel() == l.TotalBytes(), "packed_linear: weight of ",
           weight.numel(), " bytes does not hold ", rows_w, " x ", K, " packed values of kind ", kind, " (",
           l.TotalBytes(), " bytes)");
  const int64_t bias_n = activation == kSwiGlu ? 2 * N : N;
  PD_CHECK(bias.numel() == 0 || (bias.dtype() == paddle::DataType::FLOAT32 && bias.numel() == bias_n),
           "packed_linear: bias must be float32 [", bias_n, "] or empty, got ", bias.numel(), " values");
  const float* bd = bias.numel() == 0 ? nullptr : bias.data<float>();
  std::vector<int64_t> out_shape = x.shape();
  out_shape.back() = N;
  auto y = paddle::empty(out_shape, paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (M == 0) return {y};
  const float* xd = x.data<float>();
  const uint8_t* wd = weight.data<uint8_t>();
  float* yd = y.data<float>();
#ifdef __AVX512BF16__
  const bool fast = !portable;
#else
  const bool fast = false;
#endif
#ifdef FD_AMX
  const bool amx = fast && M >= kAmxMinRows && AmxPermitted();
#else
  const bool amx = false;
#endif
  // x as bf16 [M, K]; for AMX [M rounded up to 16, K rounded up to 32], zero padded
  const int64_t ldx = amx ? (K + 31) / 32 * 32 : K, rows = amx ? (M + 15) / 16 * 16 : M;
  std::unique_ptr<uint16_t[]> xb_buffer(new uint16_t[rows * ldx + 32]);  // not zeroed: RoundRows writes rows < M
  uint16_t* xb = Align64(xb_buffer.get());
  std::fill(xb + M * ldx, xb + rows * ldx, uint16_t{0});
  // wint8 with one row (Wint8Row): x rounded to bf16 and widened back, K float32 values
  std::vector<float> xf(kind == kWint8 && M == 1 ? K : 0);
  for (int64_t k = 0; k < static_cast<int64_t>(xf.size()); ++k) xf[k] = Bf16ToFloat(RoundToBf16(xd[k]));
  std::atomic<int64_t> next{0};  // the next panel to compute
#pragma omp parallel if (M * rows_w * K >= kParallelMacs)
  {
#ifdef _OPENMP
    const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
#else
    const int64_t threads = 1, id = 0;
#endif
    RoundRows(xd, K, ldx, M * id / threads, M * (id + 1) / threads, xb);
#pragma omp barrier
    if (amx) {
#ifdef FD_AMX
      switch (kind) {
        case kBf16: AmxPanels<kBf16>(xb, M, ldx, l.k2, wd, l, N, bd, activation, next, yd); break;
        case kWint8: AmxPanels<kWint8>(xb, M, ldx, l.k2, wd, l, N, bd, activation, next, yd); break;
        default: AmxPanels<kWint4>(xb, M, ldx, l.k2, wd, l, N, bd, activation, next, yd); break;
      }
#endif
    } else if (fast) {
#ifdef __AVX512BF16__
      const uint32_t* pairs = reinterpret_cast<const uint32_t*>(xb);
      switch (kind) {
        case kBf16: Panels<kBf16>(pairs, nullptr, M, l.k2, wd, l, N, bd, activation, next, yd); break;
        case kWint8: Panels<kWint8>(pairs, xf.data(), M, l.k2, wd, l, N, bd, activation, next, yd); break;
        default: Panels<kWint4>(pairs, nullptr, M, l.k2, wd, l, N, bd, activation, next, yd); break;
      }
#endif
    } else {
      std::vector<float> tile;
      for (int64_t p = next++; p < l.panels; p = next++)
        PortablePanel(xb, M, K, wd, l, kind, p, N, EpilogueOf(wd, l, kind, bd, activation, N, p), yd, tile);
    }
  }
  return {y};
}

std::vector<std::vector<int64_t>> PackedLinearInferShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                         const std::vector<int64_t>&, const int64_t&,
                                                         const int64_t& out_features, const bool&,
                                                         const int64_t&) {
  std::vector<int64_t> out = x;
  out.back() = out_features;
  return {out};
}

std::vector<paddle::DataType> PackedLinearInferDtype(const paddle::DataType& x, const paddle::DataType&,
                                                     const paddle::DataType&) {
  return {x};
}

PD_BUILD_OP(fd_packed_linear)
    .Inputs({"X", "Weight", "Bias"})
    .Outputs({"Out"})
    .Attrs({"kind: int64_t", "out_features: int64_t", "portable: bool", "activation: int64_t"})
    .SetKernelFn(PD_KERNEL(PackedLinear))
    .SetInferShapeFn(PD_INFER_SHAPE(PackedLinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PackedLinearInferDtype));

// Rows of a packed [vocab, hidden] weight (a tied embedding): ids [n] int64 -> [n, hidden] float32, the
// values packed_linear multiplies (wint8 scaled).
std::vector<paddle::Tensor> PackedEmbedding(const paddle::Tensor& ids, const paddle::Tensor& weight, int64_t kind,
                                            int64_t vocab, int64_t hidden) {
  PD_CHECK(ids.dtype() == paddle::DataType::INT64, "packed_embedding: ids must be int64");
  PD_CHECK(KnownKind(kind), "packed_embedding: unknown kind ", kind);
  const Layout l = LayoutOf(kind, vocab, hidden);
  PD_CHECK(weight.numel() == l.TotalBytes(), "packed_embedding: weight does not hold ", vocab, " x ", hidden,
           " packed values");
  const int64_t n = ids.numel();
  auto out = paddle::empty({n, hidden}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const int64_t* id = ids.data<int64_t>();
  const uint8_t* w = weight.data<uint8_t>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    PD_CHECK(id[i] >= 0 && id[i] < vocab, "packed_embedding: id ", id[i], " outside [0, ", vocab, ")");
    const int64_t p = id[i] / kPanel, c = id[i] % kPanel;
    const float* scale = ColumnScales(w, l, kind, p);
    for (int64_t k = 0; k < hidden; ++k) {
      const float v = PackedValue(w, l, kind, p, k / 2, 2 * c + k % 2);
      o[i * hidden + k] = scale ? v * scale[c] : v;
    }
  }
  return {out};
}

PD_BUILD_OP(fd_packed_embedding)
    .Inputs({"Ids", "Weight"})
    .Outputs({"Out"})
    .Attrs({"kind: int64_t", "vocab: int64_t", "hidden: int64_t"})
    .SetKernelFn(PD_KERNEL(PackedEmbedding));
