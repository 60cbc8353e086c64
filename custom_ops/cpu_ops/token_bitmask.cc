// A packed token bitmask applied to a batch of float32 logit rows, in place (structured outputs).
// Reference: apply_token_bitmask in fastdeploy/model_executor/layers/sample/token_bitmask.py.
//
// logits:  [rows, vocab] float32, updated in place
// bitmask: [m, words] int32; bit t % 32 of word t / 32 set = token t allowed (xgrammar's and
//          llguidance's layout); tokens at or past 32 * words are not allowed
// indices: [m] int64, the logits row of each bitmask row (each row at most once)
// Every token not allowed becomes -inf; allowed logits keep their bits.
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "paddle/extension.h"

namespace {

void MaskRow(float* x, const int32_t* words, int64_t num_words, int64_t vocab) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t full = std::min(num_words, vocab / 32);  // words whose 32 tokens all lie inside the row
#if defined(__AVX512F__)
  const __m512 inf16 = _mm512_set1_ps(neg_inf);
#endif
  for (int64_t w = 0; w < full; ++w) {
    const uint32_t bits = static_cast<uint32_t>(words[w]);
    if (bits == 0xFFFFFFFFu) continue;
    float* p = x + 32 * w;
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>(~bits & 0xFFFFu), inf16);
    _mm512_mask_storeu_ps(p + 16, static_cast<__mmask16>(~bits >> 16), inf16);
#else
    for (int b = 0; b < 32; ++b) {
      if (!((bits >> b) & 1u)) p[b] = neg_inf;
    }
#endif
  }
  for (int64_t t = 32 * full; t < vocab; ++t) {  // a partial last word, and tokens past the mask
    const int64_t w = t / 32;
    const bool allowed = w < num_words && ((static_cast<uint32_t>(words[w]) >> (t % 32)) & 1u);
    if (!allowed) x[t] = neg_inf;
  }
}

}  // namespace

void ApplyTokenBitmask(paddle::Tensor& logits, const paddle::Tensor& bitmask, const paddle::Tensor& indices) {
  PD_CHECK(logits.is_cpu() && bitmask.is_cpu() && indices.is_cpu(), "fd_apply_token_bitmask_ runs on CPU tensors");
  PD_CHECK(logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2,
           "logits must be float32 [rows, vocab]");
  PD_CHECK(bitmask.dtype() == paddle::DataType::INT32 && bitmask.shape().size() == 2, "bitmask must be int32 [m, words]");
  PD_CHECK(indices.dtype() == paddle::DataType::INT64 && indices.numel() == bitmask.shape()[0],
           "indices must be int64 [m], one logits row per bitmask row");
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  const int64_t m = bitmask.shape()[0], num_words = bitmask.shape()[1];
  const int64_t* index = indices.data<int64_t>();
  for (int64_t i = 0; i < m; ++i) {
    PD_CHECK(index[i] >= 0 && index[i] < rows, "bitmask row ", i, " names logits row ", index[i], " outside [0, ",
             rows, ")");
  }
  float* x = logits.data<float>();
  const int32_t* words = bitmask.data<int32_t>();
  const bool parallel = m * vocab >= (1 << 18);  // ~1 MB of logits: worth waking the threads
#pragma omp parallel for if (parallel) schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    MaskRow(x + index[i] * vocab, words + i * num_words, num_words, vocab);
  }
}

PD_BUILD_OP(fd_apply_token_bitmask_)
    .Inputs({"Logits", "Bitmask", "Indices"})
    .Outputs({"LogitsOut"})
    .SetInplaceMap({{"Logits", "LogitsOut"}})
    .SetKernelFn(PD_KERNEL(ApplyTokenBitmask));
