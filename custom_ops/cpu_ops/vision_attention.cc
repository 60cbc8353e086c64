// vision_attention: non-causal multi-head attention within segments (the frames of ERNIE-4.5-VL's
// vision transformer), from the fused, RoPE'd projection qkv [n, 3 * heads * head_dim] (each row:
// q heads | k heads | v heads). Segment f is rows cu_seqlens[f] .. cu_seqlens[f + 1] - 1; each of its
// queries attends all of its keys: out = softmax(q k^T * scale) v per head, [n, heads * head_dim].
//
// Flash-attention blocking (Dao et al. 2022, "FlashAttention"), float32 throughout: K and V are copied
// per head into contiguous [n, head_dim] panels; a work item is (segment, head, tile of 64 queries),
// handed to the threads by an atomic counter. An item keeps its 64 queries in the vector lanes: the
// scaled queries transposed, qt [head_dim, 64], and the output transposed, ot [head_dim, 64]. Per block
// of kKeyBlock keys: scores s [keys, 64] = K qt as 6-key x 64-query register tiles (a key element
// broadcast against 4 query vectors: append_attention_tiles.h's ScoreTile), an online-softmax step
// vectorised over the 64 queries (running max m, sum l, exp from vec_exp.h), then ot = alpha ot + V^T p
// as 5-dim x 64-query register tiles (a value element broadcast against 4 probability vectors), the
// rescale by alpha folded into the tile's first load. No score outside the segment is computed into the
// softmax: exact softmax.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "append_attention_tiles.h"
#include "paddle/extension.h"

namespace fd_attention {
namespace {

constexpr int kQueryVecs = 4;                                // query vectors per item
constexpr int64_t kItemQueries = kQueryVecs * kLanes;       // 64 queries per item
constexpr int kScoreKeys = 6;                                // keys per score register tile (24 accumulators)
constexpr int kValueDims = 5;                                // head_dim columns per P.V register tile (20)
constexpr int64_t kKeyBlock = 16 * kScoreKeys;               // keys per online-softmax step (96)
constexpr float kNoMax = -1e30f;  // finite: the first step's exp(kNoMax - max) is 0, not exp(inf - inf)

struct VisionItem {
  int64_t head, first, count, start, length;  // queries first .. first + count - 1; keys start .. start + length - 1
};

// Online-softmax step: s [keys, 64] scores -> exp(s - new max); m, l: [64] running max and sum;
// alpha: [64] = exp(old max - new max), the factor the output so far is rescaled by. The 4 query
// vectors go through each loop together: 4 independent max and sum chains.
inline void SoftmaxStep(float* s, int64_t keys, float* m, float* l, float* alpha) {
  Vec top[kQueryVecs], sum[kQueryVecs];
  for (int j = 0; j < kQueryVecs; ++j) {
    top[j] = Load(m + j * kLanes);
    sum[j] = Splat(0.f);
  }
  for (int64_t k = 0; k < keys; ++k)
    for (int j = 0; j < kQueryVecs; ++j) top[j] = Max(top[j], Load(s + k * kItemQueries + j * kLanes));
  for (int64_t k = 0; k < keys; ++k)
    for (int j = 0; j < kQueryVecs; ++j) {
      float* p = s + k * kItemQueries + j * kLanes;
      const Vec e = ExpOf(Sub(Load(p), top[j]));
      Store(p, e);
      sum[j] = Add(sum[j], e);
    }
  for (int j = 0; j < kQueryVecs; ++j) {
    const Vec a = ExpOf(Sub(Load(m + j * kLanes), top[j]));
    Store(alpha + j * kLanes, a);
    Store(m + j * kLanes, top[j]);
    Store(l + j * kLanes, Fma(Load(l + j * kLanes), a, sum[j]));
  }
}

// ot[d][:] = alpha * ot[d][:] + sum_k values[k][d] p[k][:] for ND columns d. p: [keys, 64];
// values: [keys, dim] from the first column; ot: [ND, 64] rows of the transposed output.
template <int ND>
inline void ValueTile(const float* p, const float* values, int64_t keys, int64_t dim, const float* alpha, float* ot) {
  Vec acc[ND][kQueryVecs];
  for (int d = 0; d < ND; ++d)
    for (int j = 0; j < kQueryVecs; ++j)
      acc[d][j] = Mul(Load(ot + d * kItemQueries + j * kLanes), Load(alpha + j * kLanes));
#pragma GCC unroll 2  // halves the loop overhead that shares the vector ports
  for (int64_t k = 0; k < keys; ++k, p += kItemQueries, values += dim) {
    Vec pk[kQueryVecs];
    for (int j = 0; j < kQueryVecs; ++j) pk[j] = Load(p + j * kLanes);
    for (int d = 0; d < ND; ++d) {
      const Vec vd = Splat(values[d]);
      for (int j = 0; j < kQueryVecs; ++j) acc[d][j] = Fma(vd, pk[j], acc[d][j]);
    }
  }
  for (int d = 0; d < ND; ++d)
    for (int j = 0; j < kQueryVecs; ++j) Store(ot + d * kItemQueries + j * kLanes, acc[d][j]);
}

// ot [dim, 64] = alpha ot + V^T p over one key block; values: [keys, dim].
inline void ValueBlock(const float* p, const float* values, int64_t keys, int64_t dim, const float* alpha, float* ot) {
  for (int64_t d = 0; d < dim; d += kValueDims) {
    const float* v = values + d;
    float* o = ot + d * kItemQueries;
    switch (std::min<int64_t>(kValueDims, dim - d)) {
      case 5: ValueTile<5>(p, v, keys, dim, alpha, o); break;
      case 4: ValueTile<4>(p, v, keys, dim, alpha, o); break;
      case 3: ValueTile<3>(p, v, keys, dim, alpha, o); break;
      case 2: ValueTile<2>(p, v, keys, dim, alpha, o); break;
      default: ValueTile<1>(p, v, keys, dim, alpha, o); break;
    }
  }
}

// One item. keys, values: this head's panels [n + kScoreKeys, dim] (the slack rows let the last score
// tile of a segment read past its end; those scores are never used).
void AttendItem(const float* qkv, int64_t width, const float* keys, const float* values, int64_t dim, float scale,
                const VisionItem& item, float* out, int64_t out_width, std::vector<float>& scratch) {
  scratch.resize(kItemQueries * (2 * dim + kKeyBlock + 3));
  float* qt = scratch.data();              // [dim, 64] scaled queries, transposed (zero past item.count)
  float* ot = qt + dim * kItemQueries;     // [dim, 64] output, transposed
  float* s = ot + dim * kItemQueries;      // [kKeyBlock, 64] scores, then probabilities
  float* m = s + kKeyBlock * kItemQueries;  // [64] running max
  float* l = m + kItemQueries;             // [64] running sum
  float* alpha = l + kItemQueries;         // [64] rescaling factor of the step
  std::fill(qt, qt + 2 * dim * kItemQueries, 0.f);
  for (int64_t r = 0; r < item.count; ++r) {
    const float* q = qkv + (item.first + r) * width + item.head * dim;
    for (int64_t d = 0; d < dim; ++d) qt[d * kItemQueries + r] = q[d] * scale;
  }
  std::fill(m, m + kItemQueries, kNoMax);
  std::fill(l, l + kItemQueries, 0.f);
  for (int64_t start = item.start; start < item.start + item.length; start += kKeyBlock) {
    const int64_t count = std::min(kKeyBlock, item.start + item.length - start);
    for (int64_t k = 0; k < count; k += kScoreKeys)
      ScoreTile<kScoreKeys, kQueryVecs>(keys + (start + k) * dim, qt, kItemQueries, dim, s + k * kItemQueries);
    SoftmaxStep(s, count, m, l, alpha);
    ValueBlock(s, values + start * dim, count, dim, alpha, ot);
  }
  for (int64_t r = 0; r < item.count; ++r) {
    float* dst = out + (item.first + r) * out_width + item.head * dim;
    const float inv = 1.f / l[r];
    for (int64_t d = 0; d < dim; ++d) dst[d] = ot[d * kItemQueries + r] * inv;
  }
}

}  // namespace
}  // namespace fd_attention

std::vector<paddle::Tensor> VisionAttention(const paddle::Tensor& qkv, const paddle::Tensor& cu_seqlens,
                                            int num_heads, float scale) {
  using namespace fd_attention;
  PD_CHECK(qkv.dtype() == paddle::DataType::FLOAT32 && qkv.shape().size() == 2, "vision_attention: qkv must be "
           "a 2-D float32 tensor");
  PD_CHECK(cu_seqlens.dtype() == paddle::DataType::INT64 && cu_seqlens.shape().size() == 1 && cu_seqlens.numel() >= 2,
           "vision_attention: cu_seqlens must be a 1-D int64 tensor of at least 2 entries");
  const int64_t n = qkv.shape()[0], width = qkv.shape()[1], heads = num_heads;
  PD_CHECK(heads > 0 && width > 0 && width % (3 * heads) == 0, "vision_attention: qkv width ", width,
           " is not 3 x ", heads, " heads x head_dim");
  const int64_t dim = width / (3 * heads), segments = cu_seqlens.numel() - 1;
  const int64_t* cu = cu_seqlens.data<int64_t>();
  PD_CHECK(cu[0] == 0 && cu[segments] == n, "vision_attention: cu_seqlens must run from 0 to the ", n, " rows");
  for (int64_t f = 0; f < segments; ++f) PD_CHECK(cu[f + 1] > cu[f], "vision_attention: segment ", f, " is empty");
  const float* x = qkv.data<float>();
  auto out = paddle::empty({n, heads * dim}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  float* y = out.data<float>();
  int64_t fmas = 0;  // both products: 2 * length^2 * dim per segment and head
  for (int64_t f = 0; f < segments; ++f) fmas += 2 * (cu[f + 1] - cu[f]) * (cu[f + 1] - cu[f]) * dim * heads;
  const bool parallel = fmas > kParallelFmas;
  // per head: K panel then V panel, each [n + kScoreKeys, dim] (zero slack rows)
  const int64_t panel = (n + kScoreKeys) * dim;
  std::vector<float> panels(2 * heads * panel, 0.f);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      std::copy_n(x + t * width + (heads + h) * dim, dim, panels.data() + 2 * h * panel + t * dim);
      std::copy_n(x + t * width + (2 * heads + h) * dim, dim, panels.data() + (2 * h + 1) * panel + t * dim);
    }
  std::vector<VisionItem> items;
  for (int64_t f = 0; f < segments; ++f)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t first = cu[f]; first < cu[f + 1]; first += kItemQueries)
        items.push_back({h, first, std::min(kItemQueries, cu[f + 1] - first), cu[f], cu[f + 1] - cu[f]});
  const int64_t count = static_cast<int64_t>(items.size());
  // handed out by an atomic counter, as append_attention's (custom_ops/README.md, "OpenMP runtime")
  std::atomic<int64_t> next{0};
#pragma omp parallel if (parallel)
  {
    std::vector<float> scratch;
    for (int64_t i = next++; i < count; i = next++) {
      const VisionItem& item = items[i];
      const float* keys = panels.data() + 2 * item.head * panel;
      AttendItem(x, width, keys, keys + panel, dim, scale, item, y, heads * dim, scratch);
    }
  }
  return {out};
}

std::vector<std::vector<int64_t>> VisionAttentionInferShape(const std::vector<int64_t>& qkv,
                                                            const std::vector<int64_t>&, int, float) {
  return {{qkv[0], qkv[1] / 3}};
}

std::vector<paddle::DataType> VisionAttentionInferDtype(const paddle::DataType& qkv, const paddle::DataType&) {
  return {qkv};
}

PD_BUILD_OP(vision_attention)
    .Inputs({"QKV", "CuSeqlens"})
    .Outputs({"Out"})
    .Attrs({"num_heads: int", "scale: float"})
    .SetKernelFn(PD_KERNEL(VisionAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(VisionAttentionInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(VisionAttentionInferDtype));
