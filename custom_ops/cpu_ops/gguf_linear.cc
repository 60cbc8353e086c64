// Linear layer on weights kept in llama.cpp's GGUF block formats, CPU, float32 activations.
//
//   y[M, N] = x[M, K] @ W^T,   W [N, K] quantized in blocks along K
//
// Two layouts, by type (ggml's type id `qtype`):
//   * Q4_0, Q4_1, Q8_0 (ggml's `block_q4_0`, `block_q4_1`, `block_q8_0`; 32 weights, a scale d, for Q4_1 a
//     minimum m), rearranged once at load by `gguf_interleave_rows` (below):
//       Q4_0: 16 bytes of nibbles;  w[j] = (lo4(qs[j]) - 8) * d, w[j+16] = (hi4(qs[j]) - 8) * d
//       Q4_1: 16 bytes of nibbles;  w[j] = lo4(qs[j]) * d + m,   w[j+16] = hi4(qs[j]) * d + m
//       Q8_0: 32 int8;              w[j] = qs[j] * d
//   * Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: row-major as the file stores them, [N, K / values * block
//     bytes] (gguf_rows.h gives each format).
// Weights are dequantized on the fly to exactly the float32 values gguf-py's `dequantize` gives
// (product and sum rounded separately, no fused multiply-add), so up to PanelFromRows rows of x the layer
// computes the same function as a float32 matmul on the dequantized matrix; only the summation order
// differs. From there (the row-major types from 7 rows) W's rows are dequantized 64 at a time into a bf16
// panel for packed_linear.cc's kernels (PanelProduct): x and W then carry bf16 rounding, as packed bf16.
//
// Interleaved layout (`gguf_interleave_rows` makes it from GGUF's row-major blocks, once at load): rows in groups
// of 4 (the last padded with zero rows); per group and block column, the 4 rows' scales as float32
// (d[4], then m[4] for Q4_1) followed by their 4 quant runs. A thread then reads one sequential
// stream, the scales need no half-to-float conversion in the inner loop, and software prefetch runs
// kPrefetchBytes ahead: a batch-1 decode of the default model's layers went from 8.3 to ~4 ms here.
//
// Paths for the interleaved types: M < 4 (decode of a few sequences) dequantizes each block into registers
// and uses it for every row of x; 4 <= M < 16 dequantizes a tile of W rows into a float32 buffer once and
// runs a register-blocked dot-product kernel over it; M >= 16 broadcasts each dequantized weight against
// 16 rows of x. The row-major types below 7 rows: gguf_linear_rows.h (a block dequantized into L1, float32
// FMAs per row of x). Threads split N (OpenMP) when the work is large.
//
// Files: gguf_linear.cc (this one: the op, its dispatch and the portable path), gguf_blocks.h (the
// interleaved layout and its block dequantization), gguf_rows.h (the row-major formats and theirs),
// gguf_linear_narrow.h (M < 16), gguf_linear_wide.h (M >= 16), gguf_linear_rows.h (the row-major kernel,
// one row of any type dequantized), gguf_interleave.cc (the gguf_interleave_rows op), gguf_embedding.cc
// (rows dequantized at lookup).
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "bf16.h"
#include "cpu_ops.h"
#include "gguf_blocks.h"
#include "gguf_linear_narrow.h"
#include "gguf_linear_rows.h"
#include "packed_linear.h"
#include "gguf_linear_wide.h"
#include "paddle/extension.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

#ifdef __AVX512F__
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

// Rows of x from which W goes to the bf16 panel kernels (PanelProduct) instead of the float32 ones, the one
// place this is decided. The row-major types from kRowMajorPanelFrom (their float32 kernel computes one dot
// product per row of x). Q4_0 / Q4_1 / Q8_0 never: their float32 kernels hold every row count (from 16
// rows each dequantized weight broadcast over 16-32 rows of x), and those files' batches keep float32's
// results (the default model's greedy tokens in a batch equal transformers' float32 ones; bf16 panels
// changed a token there).
constexpr int64_t kRowMajorPanelFrom = 7;

inline int64_t PanelFromRows(int64_t qtype) {
  return RowFormatOf(qtype).values ? kRowMajorPanelFrom : std::numeric_limits<int64_t>::max();
}

// y = x @ W^T with W's rows dequantized 64 at a time into a bf16 panel (packed_linear.h's layout, each
// value gguf-py's float32 rounded to nearest even bf16) when a thread needs it, and the packed bf16 kernels
// run on it (packed_linear.cc: AMX tiles or AVX512-BF16 register tiles): x and W carry bf16 rounding, the
// products are exact and summed in float32; never a dequantized copy of the whole matrix.
#ifdef __AVX512F__
// v[i] = lanes i of v[0..15] (a 16 x 16 transpose of 32-bit values): 32-bit and 64-bit unpacks give each
// 128-bit lane 4 rows of one column, then a 4 x 4 transpose of those lanes.
inline void Transpose16x16(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // v[4 i + j], lane L: rows 4 i .. 4 i + 3 of column 4 L + j
    v[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    v[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    v[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    v[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // column 4 L + j, lane g: v[4 g + j]'s lane L
    const __m512i a = _mm512_shuffle_i32x4(v[j], v[4 + j], 0x44), b = _mm512_shuffle_i32x4(v[j], v[4 + j], 0xEE);
    const __m512i c = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0x44), d = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0xEE);
    t[j] = _mm512_shuffle_i32x4(a, c, 0x88);
    t[4 + j] = _mm512_shuffle_i32x4(a, c, 0xDD);
    t[8 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(b, d, 0xDD);
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}
#endif

void PanelProduct(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t qtype, int64_t N, float* y) {
  // A panel is written 16 rows at a time: each row dequantized (in L1) and rounded to bf16 pairs, then 16
  // pairs of the 16 rows transposed in registers into 16 of the panel's 64-byte lines.
  constexpr int64_t kRows = 16;
  const int64_t K2 = K / 2, stride = K2 + 16;  // a row's pairs padded by a line: no 4 KB aliasing of the 16 rows
  const auto panel = [&](int64_t p, uint16_t* out) {
    thread_local std::vector<float> row;
    thread_local std::vector<uint32_t> rounded;  // [16, stride] bf16 pairs of 16 rows
    row.resize(K);
    rounded.resize(kRows * stride);
    uint32_t* pairs = reinterpret_cast<uint32_t*>(out);  // [K / 2, 64]: row c's pair k2 at k2 * 64 + c
    for (int64_t c0 = 0; c0 < packed::kPanel; c0 += kRows) {
      for (int64_t r = 0; r < kRows; ++r) {
        const int64_t n = p * packed::kPanel + c0 + r;
        if (n < N) {
          DequantWeightRow(w, qtype, K, n, row.data());
        } else {
          std::fill(row.begin(), row.end(), 0.f);
        }
        fd_cpu::RoundRow(row.data(), K, reinterpret_cast<uint16_t*>(rounded.data() + r * stride));
      }
#ifdef __AVX512F__
      for (int64_t k2 = 0; k2 < K2; k2 += 16) {  // K2 is a multiple of 16 (K of 32)
        __m512i v[16];
        for (int r = 0; r < 16; ++r) v[r] = _mm512_loadu_si512(rounded.data() + r * stride + k2);
        Transpose16x16(v);
        for (int i = 0; i < 16; ++i) _mm512_storeu_si512(pairs + (k2 + i) * packed::kPanel + c0, v[i]);
      }
#else
      for (int64_t k2 = 0; k2 < K2; ++k2)
        for (int64_t r = 0; r < kRows; ++r) pairs[k2 * packed::kPanel + c0 + r] = rounded[r * stride + k2];
#endif
    }
  };
  SourcedPanelLinear(x, M, K, N, panel, y);
}

}  // namespace

std::vector<paddle::Tensor> GgufLinear(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t qtype,
                                       int64_t out_features) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32, "gguf_linear: x must be float32 on CPU");
  PD_CHECK(weight.is_cpu() && weight.dtype() == paddle::DataType::UINT8 && weight.shape().size() == 2,
           "gguf_linear: weight must be 2-D uint8 on CPU");
  const RowFormat rf = RowFormatOf(qtype);
  const Format f = FormatOf(qtype);
  PD_CHECK(rf.values > 0 || f.group_bytes > 0, "gguf_linear: unsupported GGUF type id ", qtype,
           " (supported: 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K, 14 Q6_K)");
  const int64_t K = x.shape().back(), M = x.numel() / K, N = out_features;
  if (rf.values > 0) {
    PD_CHECK(K % rf.values == 0 && weight.shape()[0] == N && weight.shape()[1] == K / rf.values * rf.bytes,
             "gguf_linear: weight [", weight.shape()[0], ", ", weight.shape()[1], "] does not hold ", N,
             " rows of ", K, " weights of type ", qtype, " (blocks of ", rf.values, " in ", rf.bytes, " bytes)");
  } else {
    PD_CHECK(K % kBlock == 0 && weight.shape()[0] == (N + kGroup - 1) / kGroup &&
                 weight.shape()[1] == K / kBlock * f.group_bytes,
             "gguf_linear: weight [", weight.shape()[0], ", ", weight.shape()[1], "] does not hold ", N,
             " interleaved rows of ", K, " weights");
  }
  std::vector<int64_t> out_shape = x.shape();
  out_shape.back() = N;
  auto y = paddle::empty(out_shape, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* xd = x.data<float>();
  const uint8_t* wd = weight.data<uint8_t>();
  float* yd = y.data<float>();
  if (M >= PanelFromRows(qtype)) {
    PanelProduct(xd, M, K, wd, qtype, N, yd);
    return {y};
  }
  const bool parallel = M * N * K >= kParallelWork;
  if (rf.values > 0) {
#pragma omp parallel if (parallel)
    {
#ifdef _OPENMP
      const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
#else
      const int64_t threads = 1, id = 0;
#endif
      const int64_t n0 = N * id / threads, n1 = N * (id + 1) / threads;
      if (n0 < n1) RowMajorProduct(xd, M, K, wd, qtype, N, n0, n1, yd);
    }
    return {y};
  }
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

PD_BUILD_OP(gguf_linear)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"qtype: int64_t", "out_features: int64_t"})
    .SetKernelFn(PD_KERNEL(GgufLinear))
    .SetInferShapeFn(PD_INFER_SHAPE(GgufLinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GgufLinearInferDtype));
