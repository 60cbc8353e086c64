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
//   * segments (type id 1100): a layer whose parts differ in type, one part after another (SegmentedProduct).
// Weights are dequantized on the fly to exactly the float32 values gguf-py's `dequantize` gives
// (product and sum rounded separately, no fused multiply-add), so the layer computes the same function
// as a float32 matmul on the dequantized matrix at every row count; only the summation order differs.
// No float32 copy of W is made.
//
// Interleaved layout (`gguf_interleave_rows` makes it from GGUF's row-major blocks, once at load): rows in groups
// of 4 (the last padded with zero rows); per group and block column, the 4 rows' scales as float32
// (d[4], then m[4] for Q4_1) followed by their 4 quant runs. A thread then reads one sequential
// stream, the scales need no half-to-float conversion in the inner loop, and software prefetch runs
// kPrefetchBytes ahead: a batch-1 decode of the default model's layers went from 8.3 to ~4 ms here.
//
// Paths: M < 16 (decode of a few sequences, a speculative step's verification) on the interleaved types
// dequantizes each block into registers once and uses it for every row of x (gguf_linear_narrow.h); the
// row-major types below 16 rows dequantize 256 values of a row at a time into L1 and multiply them with
// each row of x (gguf_linear_rows.h); M >= 16,
// every type, broadcasts each dequantized weight against 16 rows of x (gguf_linear_wide.h, on chunks of
// W rows dequantized by the type's function). Threads split N (OpenMP) when the work is large.
//
// Files: gguf_linear.cc (this one: the op, its dispatch and the portable path), gguf_blocks.h (the
// interleaved layout and its block dequantization), gguf_rows.h (the row-major formats and theirs),
// gguf_linear_narrow.h (M < 16), gguf_linear_wide.h (M >= 16), gguf_linear_rows.h (the row-major kernel
// below 16 rows, one row of any type dequantized), gguf_interleave.cc (the gguf_interleave_rows op), gguf_embedding.cc
// (rows dequantized at lookup).
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gguf_blocks.h"
#include "gguf_linear_narrow.h"
#include "gguf_linear_rows.h"
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
  if (xt == nullptr) return NarrowGroups<QT>(x, w, M, K, N, n0 / kGroup, (n1 + kGroup - 1) / kGroup, y);  // n0: whole groups
  const Format f = FormatOf(QT);
  const int64_t blocks = K / kBlock;
  const auto dequant = [&](int64_t n, int64_t k0, int64_t kc, float* out) {
    DequantRow<QT>(w, f, blocks, n, k0 / kBlock, kc / kBlock, out);
  };
  WideM(xt, Mp, dequant, w, blocks * f.group_bytes / kGroup, M, K, N, n0, n1, y, tile);
}

// A row-major type: below kWideM rows gguf_linear_rows.h's kernel, else the broadcast kernel on chunks of
// rows dequantized a block (256 values, or 32 for Q5_0 / Q5_1) at a time.
template <int64_t QT>
void RowMajorRowsOf(const float* x, const float* xt, int64_t Mp, const uint8_t* w, int64_t M, int64_t K, int64_t N,
                    int64_t n0, int64_t n1, float* y, std::vector<float>& tile) {
  if (xt == nullptr) return RowMajorRows<QT>(x, M, K, w, N, n0, n1, y);
  const RowFormat f = RowFormatOf(QT);
  const int64_t row_bytes = K / f.values * f.bytes;
  const auto dequant = [&](int64_t n, int64_t k0, int64_t kc, float* out) {
    const uint8_t* block = w + n * row_bytes + k0 / f.values * f.bytes;
    for (int64_t k = 0; k < kc; k += f.values, block += f.bytes) DequantRowBlock<QT>(block, out + k);
  };
  WideM(xt, Mp, dequant, w, row_bytes, M, K, N, n0, n1, y, tile);
}

void Rows(const float* x, const float* xt, int64_t Mp, const uint8_t* w, int64_t qtype, int64_t M, int64_t K,
          int64_t N, int64_t n0, int64_t n1, float* y, std::vector<float>& tile) {
  switch (qtype) {
    case kQ5_0: RowMajorRowsOf<kQ5_0>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ5_1: RowMajorRowsOf<kQ5_1>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ2_K: RowMajorRowsOf<kQ2_K>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ3_K: RowMajorRowsOf<kQ3_K>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ4_K: RowMajorRowsOf<kQ4_K>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ5_K: RowMajorRowsOf<kQ5_K>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ6_K: RowMajorRowsOf<kQ6_K>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ4_0: RowsOf<kQ4_0>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    case kQ4_1: RowsOf<kQ4_1>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
    default: RowsOf<kQ8_0>(x, xt, Mp, w, M, K, N, n0, n1, y, tile); return;
  }
}
#else
// Portable path: dequantize one W row, dot it with every row of x.
void Rows(const float* x, const float*, int64_t, const uint8_t* w, int64_t qtype, int64_t M, int64_t K, int64_t N,
          int64_t n0, int64_t n1, float* y, std::vector<float>& tile) {
  if (RowFormatOf(qtype).values > 0) return RowMajorProduct(x, M, K, w, qtype, N, n0, n1, y);
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

}  // namespace

// A segmented weight (qtype kSegmented): a Linear whose parts (q / k / v, gate / up) are of different
// types, as in Q4_K_M files (v in Q6_K where q and k are Q4_K), held as one 1-D uint8 tensor: a header of
// int64 words, [count, then per segment: type id, output rows, its weight's 2 dims, its byte offset],
// then each segment's weight in its own type's layout. y's columns are the segments' outputs in order,
// each computed by this op on a view of its bytes: the function of the unsegmented layer.
std::vector<paddle::Tensor> GgufLinear(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t qtype,
                                       int64_t out_features);

namespace {
constexpr int64_t kSegmented = 1100;
constexpr int64_t kSegmentWords = 5;

paddle::Tensor SegmentedProduct(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t out_features) {
  PD_CHECK(weight.is_cpu() && weight.dtype() == paddle::DataType::UINT8 && weight.shape().size() == 1 &&
               weight.numel() >= 8,
           "gguf_linear: a segmented weight must be 1-D uint8 on CPU");
  uint8_t* base = const_cast<uint8_t*>(weight.data<uint8_t>());
  const int64_t* header = reinterpret_cast<const int64_t*>(base);
  const int64_t count = header[0];
  PD_CHECK(count > 0 && 8 * (1 + kSegmentWords * count) <= weight.numel(), "gguf_linear: bad segment header");
  const int64_t K = x.shape().back(), M = x.numel() / K;
  std::vector<int64_t> out_shape = x.shape();
  out_shape.back() = out_features;
  auto y = paddle::empty(out_shape, paddle::DataType::FLOAT32, paddle::CPUPlace());
  float* yd = y.data<float>();
  int64_t column = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t* seg = header + 1 + kSegmentWords * i;  // type, rows, dim 0, dim 1, offset
    PD_CHECK(seg[0] != kSegmented && seg[4] >= 0 && seg[4] + seg[2] * seg[3] <= weight.numel() &&
                 column + seg[1] <= out_features,
             "gguf_linear: segment ", i, " lies outside its weight or its output");
    const paddle::Tensor part =
        paddle::from_blob(base + seg[4], {seg[2], seg[3]}, paddle::DataType::UINT8, phi::DataLayout::NCHW,
                          paddle::CPUPlace());
    const paddle::Tensor yp = GgufLinear(x, part, seg[0], seg[1])[0];  // [M, rows]
    const float* src = yp.data<float>();
    for (int64_t m = 0; m < M; ++m)
      std::memcpy(yd + m * out_features + column, src + m * seg[1], seg[1] * sizeof(float));
    column += seg[1];
  }
  PD_CHECK(column == out_features, "gguf_linear: the segments give ", column, " outputs, the layer has ", out_features);
  return y;
}
}  // namespace

std::vector<paddle::Tensor> GgufLinear(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t qtype,
                                       int64_t out_features) {
  if (qtype == kSegmented) return {SegmentedProduct(x, weight, out_features)};
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32, "gguf_linear: x must be float32 on CPU");
  const int64_t K = x.shape().back(), M = x.numel() / K, N = out_features;
  CheckBlockWeight(weight, qtype, N, K, "gguf_linear",
                   " (supported: 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K, 14 Q6_K, " +
                       std::to_string(kSegmented) + " segments of these)");
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

PD_BUILD_OP(gguf_linear)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"qtype: int64_t", "out_features: int64_t"})
    .SetKernelFn(PD_KERNEL(GgufLinear))
    .SetInferShapeFn(PD_INFER_SHAPE(GgufLinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GgufLinearInferDtype));
