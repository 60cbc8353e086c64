// Decode attention over the paged KV cache, CPU, float32.
//
// For each request i (one query token) and KV head h, the `group` query heads that share h attend
// over the request's first context_lens[i] cached tokens, read in place through its block table
// (no gather copy): K and V rows are each streamed once, softmax is exact (max-subtracted), and
// work is spread over (request, KV head) pairs with OpenMP. Reference: the pure-Paddle backend in
// fastdeploy/model_executor/layers/attention.py (same math: softmax(q k^T * scale) v).
//
// q:            [n, num_heads, head_dim]
// key_cache:    [num_blocks, kv_heads, block_size, head_dim]  (FastDeploy's layout)
// value_cache:  [num_blocks, kv_heads, block_size, head_dim]
// block_tables: [n, max_blocks] int64, -1 padded
// context_lens: [n] int64, tokens in the cache for each request (this step's token included)
// out:          [n, num_heads * head_dim]
#include <algorithm>
#include <cmath>
#include <vector>

#include "paddle/extension.h"

namespace {
// Rows of K/V for token t of a request: block tables map t / block_size to a physical block.
inline const float* CacheRow(const float* cache, const int64_t* blocks, int64_t t, int64_t kv_head,
                             int64_t kv_heads, int64_t block_size, int64_t head_dim) {
  return cache + ((blocks[t / block_size] * kv_heads + kv_head) * block_size + t % block_size) * head_dim;
}

void AttendOneKvHead(const float* q, const float* key_cache, const float* value_cache, const int64_t* blocks,
                     int64_t context_len, int64_t kv_head, int64_t kv_heads, int64_t block_size, int64_t head_dim,
                     int64_t group, float scale, float* out, std::vector<float>& scores) {
  scores.resize(group * context_len);
  for (int64_t start = 0; start < context_len; start += block_size) {
    const int64_t end = std::min(context_len, start + block_size);
    const float* k = CacheRow(key_cache, blocks, start, kv_head, kv_heads, block_size, head_dim);
    for (int64_t t = start; t < end; ++t, k += head_dim) {
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = q + g * head_dim;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < head_dim; ++d) dot += qg[d] * k[d];
        scores[g * context_len + t] = dot * scale;
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores.data() + g * context_len;
    float max_score = s[0];
    for (int64_t t = 1; t < context_len; ++t) max_score = std::max(max_score, s[t]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < context_len; ++t) {
      s[t] = std::exp(s[t] - max_score);
      sum += s[t];
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t t = 0; t < context_len; ++t) s[t] *= inv;
  }
  std::fill(out, out + group * head_dim, 0.f);
  for (int64_t start = 0; start < context_len; start += block_size) {
    const int64_t end = std::min(context_len, start + block_size);
    const float* v = CacheRow(value_cache, blocks, start, kv_head, kv_heads, block_size, head_dim);
    for (int64_t t = start; t < end; ++t, v += head_dim) {
      for (int64_t g = 0; g < group; ++g) {
        const float p = scores[g * context_len + t];
        float* o = out + g * head_dim;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) o[d] += p * v[d];
      }
    }
  }
}
}  // namespace

std::vector<paddle::Tensor> PagedDecodeAttention(const paddle::Tensor& q, const paddle::Tensor& key_cache,
                                                 const paddle::Tensor& value_cache, const paddle::Tensor& block_tables,
                                                 const paddle::Tensor& context_lens, float scale) {
  PD_CHECK(q.is_cpu() && key_cache.is_cpu(), "paged_decode_attention runs on CPU tensors");
  const int64_t n = q.shape()[0], num_heads = q.shape()[1], head_dim = q.shape()[2];
  const int64_t kv_heads = key_cache.shape()[1], block_size = key_cache.shape()[2];
  const int64_t max_blocks = block_tables.shape()[1], group = num_heads / kv_heads;
  auto out = paddle::empty({n, num_heads * head_dim}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* q_data = q.data<float>();
  const float* k_data = key_cache.data<float>();
  const float* v_data = value_cache.data<float>();
  const int64_t* tables = block_tables.data<int64_t>();
  const int64_t* lens = context_lens.data<int64_t>();
  float* out_data = out.data<float>();
#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < n * kv_heads; ++item) {
      const int64_t i = item / kv_heads, h = item % kv_heads;
      const int64_t offset = (i * num_heads + h * group) * head_dim;
      AttendOneKvHead(q_data + offset, k_data, v_data, tables + i * max_blocks, lens[i], h, kv_heads, block_size,
                      head_dim, group, scale, out_data + offset, scores);
    }
  }
  return {out};
}

std::vector<std::vector<int64_t>> PagedDecodeAttentionInferShape(const std::vector<int64_t>& q,
                                                                 const std::vector<int64_t>&,
                                                                 const std::vector<int64_t>&,
                                                                 const std::vector<int64_t>&,
                                                                 const std::vector<int64_t>&) {
  return {{q[0], q[1] * q[2]}};
}

std::vector<paddle::DataType> PagedDecodeAttentionInferDtype(const paddle::DataType& q, const paddle::DataType&,
                                                             const paddle::DataType&, const paddle::DataType&,
                                                             const paddle::DataType&) {
  return {q};
}

PD_BUILD_OP(paged_decode_attention)
    .Inputs({"Q", "KeyCache", "ValueCache", "BlockTables", "ContextLens"})
    .Outputs({"Out"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(PagedDecodeAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(PagedDecodeAttentionInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PagedDecodeAttentionInferDtype));
