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
//
// Files: gguf_linear.cc (this one: the op, its dispatch and the portable path), gguf_blocks.h (the
// layout and block dequantization), gguf_linear_narrow.h (M < 16), gguf_linear_wide.h (M >= 16),
// gguf_interleave.cc (the gguf_interleave_rows op).
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

}  // namespace

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

PD_BUILD_OP(gguf_linear)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"qtype: int64_t", "out_features: int64_t"})
    .SetKernelFn(PD_KERNEL(GgufLinear))
    .SetInferShapeFn(PD_INFER_SHAPE(GgufLinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GgufLinearInferDtype));
