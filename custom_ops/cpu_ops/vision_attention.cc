// vision_attention: non-causal multi-head attention within segments (the frames of ERNIE-4.5-VL's
// vision transformer), from the fused, RoPE'd projection qkv [n, 3 * heads * head_dim] (each row:
// q heads | k heads | v heads). Segment f is rows cu_seqlens[f] .. cu_seqlens[f + 1] - 1; each of its
// queries attends all of its keys: out = softmax(q k^T * scale) v per head, [n, heads * head_dim].
// K and V are first copied per head into contiguous [n, head_dim] panels; then work items (segment,
// head, tile of up to 64 queries) run flash-attention style over 64-key blocks with the tile kernels
// of append_attention's prefill (append_attention_tiles.h), padding keys masked; exact softmax.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "append_attention_common.h"
#include "append_attention_tiles.h"
#include "paddle/extension.h"

namespace fd_attention {
namespace {

constexpr int64_t kKeyBlock = 64;

struct Segment {
  int64_t head, first, count, start, length;  // queries first .. first + count - 1 of rows start .. start + length - 1
};

// Queries seg.first .. + seg.count of one head against all keys of their segment; keys/values: [n + 3, dim].
void SegmentTile(const float* qkv, int64_t width, const float* keys, const float* values, int64_t dim, float scale,
                 const Segment& seg, float* out, int64_t out_width, Scratch& scratch) {
  const int64_t rows = seg.count, rp = (rows + kLanes - 1) / kLanes * kLanes;
  scratch.floats.resize(rp * (2 * dim + kKeyBlock + 3));
  scratch.offsets.resize(rp);
  float* qt = scratch.floats.data();   // [dim, rp] scaled queries, transposed
  float* o = qt + dim * rp;            // [rp, dim]
  float* s = o + rp * dim;             // [kKeyBlock, rp]
  float* m = s + kKeyBlock * rp;       // [rp] running max
  float* l = m + rp;                   // [rp] running sum
  float* alpha = l + rp;               // [rp] rescaling factor; first the scale of each row
  int32_t* offsets = scratch.offsets.data();
  for (int64_t r = 0; r < rp; ++r) {  // rows past `rows` repeat the last one, scaled by 0
    offsets[r] = static_cast<int32_t>(std::min(r, rows - 1) * width);
    alpha[r] = r < rows ? scale : 0.f;
    m[r] = kMasked;
    l[r] = 0.f;
  }
  const float* q0 = qkv + seg.first * width + seg.head * dim;
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t r = 0; r < rp; r += kLanes) Store(qt + d * rp + r, Mul(Gather(q0 + d, offsets + r), Load(alpha + r)));
  std::fill(o, o + rp * dim, 0.f);
  for (int64_t start = 0; start < seg.length; start += kKeyBlock) {
    const int64_t count = std::min(kKeyBlock, seg.length - start), padded = (count + 3) / 4 * 4;
    const int64_t row0 = seg.start + start;
    ScoreBlock(keys + row0 * dim, padded, qt, rp, dim, s);
    for (int64_t k = count; k < padded; ++k) std::fill(s + k * rp, s + (k + 1) * rp, kMasked);
    SoftmaxStep(s, padded, rp, dim, m, l, alpha, o);
    AccumulateValues(s, rp, 1, rows, values + row0 * dim, count, dim, o);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + (seg.first + r) * out_width + seg.head * dim;
    const float inv = 1.f / l[r];
    for (int64_t d = 0; d < dim; ++d) dst[d] = o[r * dim + d] * inv;
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
  PD_CHECK(heads > 0 && width % (3 * heads) == 0, "vision_attention: qkv width ", width, " is not 3 x ", heads,
           " heads x head_dim");
  const int64_t dim = width / (3 * heads), segments = cu_seqlens.numel() - 1;
  PD_CHECK(dim % kLanes == 0, "vision_attention: head_dim ", dim, " must be a multiple of ", kLanes);
  const int64_t* cu = cu_seqlens.data<int64_t>();
  PD_CHECK(cu[0] == 0 && cu[segments] == n, "vision_attention: cu_seqlens must run from 0 to the ", n, " rows");
  for (int64_t f = 0; f < segments; ++f) PD_CHECK(cu[f + 1] > cu[f], "vision_attention: segment ", f, " is empty");
  const float* x = qkv.data<float>();
  auto out = paddle::empty({n, heads * dim}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  float* y = out.data<float>();
  // per head: K and V panels [n + 3, dim] (3 rows of slack: key blocks are scored 4 keys at a time)
  std::vector<float> panels(2 * heads * (n + 3) * dim, 0.f);
  const int64_t panel = (n + 3) * dim;
  const bool parallel = n * n / std::max<int64_t>(segments, 1) * heads * dim > kParallelFmas;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      std::copy_n(x + t * width + (heads + h) * dim, dim, panels.data() + h * panel + t * dim);
      std::copy_n(x + t * width + (2 * heads + h) * dim, dim, panels.data() + (heads + h) * panel + t * dim);
    }
  std::vector<Segment> items;
  for (int64_t f = 0; f < segments; ++f)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t first = cu[f]; first < cu[f + 1]; first += kTileRows)
        items.push_back({h, first, std::min(kTileRows, cu[f + 1] - first), cu[f], cu[f + 1] - cu[f]});
  const int64_t count = static_cast<int64_t>(items.size());
  // handed out by an atomic counter, as append_attention's (custom_ops/README.md, "OpenMP runtime")
  std::atomic<int64_t> next{0};
#pragma omp parallel if (parallel)
  {
    Scratch scratch;
    for (int64_t i = next++; i < count; i = next++) {
      const Segment& seg = items[i];
      SegmentTile(x, width, panels.data() + seg.head * panel, panels.data() + (heads + seg.head) * panel, dim, scale,
                  seg, y, heads * dim, scratch);
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
