// Linear layer on weights kept in llama.cpp's GGUF block formats, CPU, float32 activations.
//
//   y[M, N] = x[M, K] @ W^T,   W [N, K] quantized in blocks of 32 weights along K
//
// Block formats (ggml's `block_q4_0`, `block_q4_1`, `block_q8_0`; per block a scale d, for Q4_1 a minimum m):
//   Q4_0: 16 bytes of nibbles;  w[j] = (lo4(qs[j]) - 8) * d, w[j+16] = (hi4(qs[j]) - 8) * d
//   Q4_1: 16 bytes of nibbles;  w[j] = lo4(qs[j]) * d + m,   w[j+16] = hi4(qs[j]) * d + m
//   Q8_0: 32 int8;              w[j] = qs[j] * d
// Weights are dequantized on the fly to exactly the float32 values gguf-py's `dequantize` gives
// (product and sum rounded separately, no fused multiply-add), so the layer computes the same
// function as a float32 matmul on the dequantized matrix; only the summation order differs.
//
// Layout (`gguf_interleave_rows` makes it from GGUF's row-major blocks, once at load): rows in groups
// of 4 (the last padded with zero rows); per group and block column, the 4 rows' scales as float32
// (d[4], then m[4] for Q4_1) followed by their 4 quant runs. A thread then reads one sequential
// stream, the scales need no half-to-float conversion in the inner loop, and software prefetch runs
// kPrefetchBytes ahead: a batch-1 decode of the default model's layers went from 8.3 to ~4 ms here.
//
// Paths: M < 4 (decode of a few sequences) dequantizes each block into registers and uses it for every
// row of x; 4 <= M < 16 dequantizes a tile of W rows into a float32 buffer once and runs a register-
// blocked dot-product kernel over it; M >= 16 broadcasts each dequantized weight against 16 rows of x.
// Threads split N (OpenMP) when the work is large.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "paddle/extension.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = 4;                 // rows interleaved per group
constexpr int64_t kTileRows = 16;             // W rows dequantized per tile (4 <= M < 16), a multiple of kGroup
constexpr int64_t kParallelWork = 1 << 18;    // multiply-adds below which one thread is faster
constexpr int64_t kWideM = 16;                // rows of x from which the broadcast kernel is used
constexpr int64_t kPrefetchBytes = 3072;      // software prefetch distance in the weight stream (M < 4)

enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8 };  // ggml's type ids

constexpr int64_t kScaleRun = 4 * kGroup;    // bytes of one float32 scale per row of a group

// Bytes of one group's block column: scales (float32) then quants, for 4 rows.
struct Format {
  int64_t gguf_bytes, scale_bytes, quant_bytes, group_bytes;
};

Format FormatOf(int64_t qtype) {
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

// M >= kWideM: each dequantized weight is broadcast against 16 rows of x per vector. xt is x
// transposed, [K, Mp] with Mp = M rounded up to 16 (zero padded). K is cut into chunks of kChunk so
// that a chunk of xt stays in L1 while the W tiles of a panel (kPanelRows rows) pass over it;
// partial sums of a tile (kWideRows W rows x MV * 16 rows of x) live in `acc` between chunks.
constexpr int64_t kWideRows = 8;
constexpr int64_t kChunk = 256;       // multiple of kBlock
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

template <int64_t QT>
void WideM(const float* xt, int64_t Mp, const uint8_t* w, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1,
           float* y, std::vector<float>& tile) {
  const Format f = FormatOf(QT);
  const int64_t blocks = K / kBlock;
  std::vector<float> acc(kPanelRows * 32);  // partial sums of one panel: per tile [kWideRows][32]
  tile.assign(kWideRows * kChunk, 0.f);     // rows past the end of W stay zero
  for (int64_t m = 0; m < M; m += 32) {
    const int64_t mv = std::min<int64_t>(32, M - m) > 16 ? 2 : 1, mr = std::min<int64_t>(32, M - m);
    for (int64_t p0 = n0; p0 < n1; p0 += kPanelRows) {  // a panel of W rows: its sums stay in L2
      const int64_t p1 = std::min(n1, p0 + kPanelRows), tiles = (p1 - p0 + kWideRows - 1) / kWideRows;
      // The next panel's weights (whole groups, so one contiguous range) are prefetched into L2, a
      // slice per tile step: the panel's own reads jump between groups and defeat the hardware
      // prefetcher (batch-32 decode layers: 10% faster here).
      const uint8_t* next = w + (p1 / kGroup) * blocks * f.group_bytes;
      const int64_t next_bytes = std::min(n1 - p1, kPanelRows) / kGroup * blocks * f.group_bytes;
      const int64_t steps = (K + kChunk - 1) / kChunk * tiles, slice = (next_bytes / steps + 63) / 64 * 64;
      int64_t step = 0;
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kc = std::min(kChunk, K - k0);
        for (int64_t t = 0; t < tiles; ++t, ++step) {
          for (int64_t b = step * slice; b < std::min(next_bytes, (step + 1) * slice); b += 64)
            _mm_prefetch(reinterpret_cast<const char*>(next + b), _MM_HINT_T1);
          const int64_t row0 = p0 + t * kWideRows, nr = std::min(kWideRows, p1 - row0);
          for (int64_t j = 0; j < nr; ++j)
            DequantRow<QT>(w, f, blocks, row0 + j, k0 / kBlock, kc / kBlock, tile.data() + j * kc);
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
void Transpose(const float* x, int64_t M, int64_t K, int64_t Mp, int64_t k0, int64_t k1, float* xt) {
  const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(static_cast<int>(K)));
  for (int64_t k = k0; k < k1; ++k)
    for (int64_t m = 0; m < Mp; m += 16) {
      const __mmask16 rows = M - m >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (M - m)) - 1);
      _mm512_storeu_ps(xt + k * Mp + m,
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rows, offsets, x + m * K + k, sizeof(float)));
    }
}

template <int64_t QT>
void RowsOf(const float* x, const float* xt, int64_t Mp, const uint8_t* w, int64_t M, int64_t K, int64_t N,
            int64_t n0, int64_t n1, float* y, std::vector<float>& tile) {
  const int64_t g0 = n0 / kGroup, g1 = (n1 + kGroup - 1) / kGroup;  // n0 is a multiple of kGroup
  switch (M) {
    case 1: SmallGroups<1, QT>(x, w, K, N, g0, g1, y); return;
    case 2: SmallGroups<2, QT>(x, w, K, N, g0, g1, y); return;
    case 3: SmallGroups<3, QT>(x, w, K, N, g0, g1, y); return;
    default:
      if (xt != nullptr) {
        WideM<QT>(xt, Mp, w, M, K, N, n0, n1, y, tile);
      } else {
        LargeM<QT>(x, w, M, K, N, n0, n1, y, tile);
      }
  }
}

void Rows(const float* x, const float* xt, int64_t Mp, const uint8_t* w, int64_t qtype, int64_t M, int64_t K,
          int64_t N, int64_t n0, int64_t n1, float* y, std::vector<float>& tile) {
  switch (qtype) {
    case kQ4_0: RowsOf<kQ4_0>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ4_1: RowsOf<kQ4_1>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    default: RowsOf<kQ8_0>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
  }
}
#else
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

// Portable path: dequantize one W row, dot it with every row of x.
void Rows(const float* x, const float*, int64_t, const uint8_t* w, int64_t qtype, int64_t M, int64_t K, int64_t N,
          int64_t n0, int64_t n1, float* y, std::vector<float>& tile) {
  const Format f = FormatOf(qtype);
  const int64_t blocks = K / kBlock;
  tile.resize(K);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t b = 0; b < blocks; ++b) DequantBlockScalar(Ref(w, qtype, f, blocks, n, b), qtype, tile.data() + b * kBlock);
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * K;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t k = 0; k < K; ++k) dot += xm[k] * tile[k];
      y[m * N + n] = dot;
    }
  }
}
#endif

void CheckWeight(const paddle::Tensor& weight, int64_t qtype, const Format& f, const char* op) {
  PD_CHECK(weight.is_cpu() && weight.dtype() == paddle::DataType::UINT8, op, ": weight must be uint8 on CPU");
  PD_CHECK(f.group_bytes > 0, op, ": unsupported GGUF type id ", qtype, " (supported: 2 Q4_0, 3 Q4_1, 8 Q8_0)");
  PD_CHECK(weight.shape().size() == 2, op, ": weight must be 2-D");
}

}  // namespace

std::vector<paddle::Tensor> GgufInterleaveRows(const paddle::Tensor& blocks, int64_t qtype) {
  const Format f = FormatOf(qtype);
  CheckWeight(blocks, qtype, f, "gguf_interleave_rows");
  const int64_t N = blocks.shape()[0], row_bytes = blocks.shape()[1], count = row_bytes / f.gguf_bytes;
  PD_CHECK(row_bytes % f.gguf_bytes == 0, "gguf_interleave_rows: rows of ", row_bytes, " bytes are not whole blocks of ",
           f.gguf_bytes);
  const int64_t groups = (N + kGroup - 1) / kGroup;
  auto out = paddle::full({groups, count * f.group_bytes}, 0, paddle::DataType::UINT8, paddle::CPUPlace());
  const uint8_t* src = blocks.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = n % kGroup;
    for (int64_t b = 0; b < count; ++b) {
      const uint8_t* block = src + n * row_bytes + b * f.gguf_bytes;
      uint8_t* column = dst + ((n / kGroup) * count + b) * f.group_bytes;
      const float d = Half(block);
      std::memcpy(column + 4 * r, &d, 4);
      if (qtype == kQ4_1) {
        const float m = Half(block + 2);
        std::memcpy(column + kScaleRun + 4 * r, &m, 4);
      }
      const int64_t header = f.gguf_bytes - f.quant_bytes;  // the block's half d (and m)
      std::memcpy(column + f.scale_bytes + r * f.quant_bytes, block + header, f.quant_bytes);
    }
  }
  return {out};
}

std::vector<paddle::Tensor> GgufLinear(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t qtype,
                                       int64_t out_features) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32, "gguf_linear: x must be float32 on CPU");
  const Format f = FormatOf(qtype);
  CheckWeight(weight, qtype, f, "gguf_linear");
  const int64_t K = x.shape().back(), M = x.numel() / K, N = out_features;
  PD_CHECK(K % kBlock == 0 && weight.shape()[0] == (N + kGroup - 1) / kGroup &&
               weight.shape()[1] == K / kBlock * f.group_bytes,
           "gguf_linear: weight [", weight.shape()[0], ", ", weight.shape()[1], "] does not hold ", N, " interleaved rows of ",
           K, " weights");
  std::vector<int64_t> out_shape = x.shape();
  out_shape.back() = N;
  auto y = paddle::empty(out_shape, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* xd = x.data<float>();
  const uint8_t* wd = weight.data<uint8_t>();
  float* yd = y.data<float>();
  const bool parallel = M * N * K >= kParallelWork;
#ifdef __AVX512F__
  const bool wide = M >= kWideM;
#else
  const bool wide = false;
#endif
  const int64_t Mp = (M + 15) / 16 * 16;
  std::unique_ptr<float[]> xt(wide ? new float[K * Mp] : nullptr);  // x transposed [K, Mp] for the wide kernel
#pragma omp parallel if (parallel)
  {
    std::vector<float> tile;
#ifdef _OPENMP
    const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
#else
    const int64_t threads = 1, id = 0;
#endif
#ifdef __AVX512F__
    if (wide) {
      Transpose(xd, M, K, Mp, K * id / threads, K * (id + 1) / threads, xt.get());
#pragma omp barrier
    }
#endif
    // contiguous ranges of whole tiles per thread
    const int64_t tiles = (N + kTileRows - 1) / kTileRows;
    const int64_t n0 = std::min(N, tiles * id / threads * kTileRows);
    const int64_t n1 = std::min(N, tiles * (id + 1) / threads * kTileRows);
    if (n0 < n1) Rows(xd, xt.get(), Mp, wd, qtype, M, K, N, n0, n1, yd, tile);
  }
  return {y};
}

std::vector<std::vector<int64_t>> GgufLinearInferShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                       const int64_t&, const int64_t& out_features) {
  std::vector<int64_t> out = x;
  out.back() = out_features;
  return {out};
}

std::vector<paddle::DataType> GgufLinearInferDtype(const paddle::DataType& x, const paddle::DataType&) { return {x}; }

PD_BUILD_OP(gguf_interleave_rows)
    .Inputs({"Blocks"})
    .Outputs({"Out"})
    .Attrs({"qtype: int64_t"})
    .SetKernelFn(PD_KERNEL(GgufInterleaveRows));

PD_BUILD_OP(gguf_linear)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"qtype: int64_t", "out_features: int64_t"})
    .SetKernelFn(PD_KERNEL(GgufLinear))
    .SetInferShapeFn(PD_INFER_SHAPE(GgufLinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GgufLinearInferDtype));
