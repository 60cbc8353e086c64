// append_attention's decode item (a request with one new token this step): the `group` query heads
// of one KV head score every cached key (16 keys per transposing reduction, K rows prefetched ahead),
// one exact softmax per head, then P.V over the value rows.
#include <algorithm>
#include <cstdint>

#include "append_attention_common.h"

namespace fd_attention {
namespace {

inline float Dot(const float* a, const float* b, int64_t n) {
  Vec acc = Splat(0.f);
  for (int64_t d = 0; d < n; d += kLanes) acc = Fma(Load(a + d), Load(b + d), acc);
  return ReduceAdd(acc);
}

// s[k] = q . keys[k] for 16 consecutive key rows (independent FMA chains, one transposing reduction).
inline void Dot16(const float* q, const float* keys, int64_t dim, float* s) {
  Vec acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = Splat(0.f);
  for (int64_t d = 0; d < dim; d += kLanes) {
    const Vec qd = Load(q + d);
    for (int k = 0; k < kLanes; ++k) acc[k] = Fma(qd, Load(keys + k * dim + d), acc[k]);
  }
  Store(s, SumEach(acc));
}

// s[h * stride + k] = q[h] . keys[k], heads h < group, keys k < count, of one cache block whose
// rows beyond `count` (up to block_size) may be read: their scores land in s and are never used.
// wide: [16, dim] scratch for the widened rows of a bf16 cache.
template <typename Cache>
void DecodeScores(const float* q, int64_t group, const Cache* keys, int64_t count, int64_t block_size,
                  int64_t dim, float* s, int64_t stride, float* wide) {
  int64_t k = 0;
  for (; k < count && k + kLanes <= block_size; k += kLanes) {
    if (k + kPrefetchRows < count) PrefetchRows(keys + (k + kPrefetchRows) * dim, kLanes, dim);
    const float* rows = AsFloats(keys + k * dim, kLanes * dim, wide);
    for (int64_t h = 0; h < group; ++h) Dot16(q + h * dim, rows, dim, s + h * stride + k);
  }
  if (k == count) return;
  const int64_t first = k;  // the block's last count - first keys (fewer than 16), one at a time
  const float* rows = AsFloats(keys + first * dim, (count - first) * dim, wide);
  for (; k < count; ++k)
    for (int64_t h = 0; h < group; ++h) s[h * stride + k] = Dot(q + h * dim, rows + (k - first) * dim, dim);
}

}  // namespace

// One query token of request i, the `group` heads of KV head h: scores, exact softmax, P.V.
template <typename Cache>
void DecodeItem(const Inputs<Cache>& in, const Geometry& g, const Item& item, Scratch& scratch) {
  const int64_t dim = g.head_dim, group = g.group, token = in.cu_seqlens[item.request];
  const int64_t context = in.history[item.request] + 1;
  const int64_t* blocks = in.block_tables + item.request * g.max_blocks;
  const int64_t stride = context + kLanes;  // room for a last partial 16 (scores or padding)
  scratch.floats.resize(group * (2 * dim + stride + 1) + kLanes * dim);
  float* q = scratch.floats.data();      // [group, dim], scaled
  float* o = q + group * dim;     // [group, dim]
  float* sums = o + group * dim;  // [group]
  float* s = sums + group;        // [group, stride]
  float* wide = s + group * stride;  // [16, dim]: bf16 cache rows widened
  const float* q_in = QueryRow(in, g, token, item.kv_head * group);
  for (int64_t i = 0; i < group * dim; ++i) q[i] = q_in[i] * g.scale;
  for (int64_t start = 0; start < context; start += g.block_size) {
    const Cache* k = BlockRows(in.key_cache, g, blocks[start / g.block_size], item.kv_head);
    DecodeScores(q, group, k, std::min(g.block_size, context - start), g.block_size, dim, s + start, stride, wide);
  }
  const int64_t padded = (context + kLanes - 1) / kLanes * kLanes;  // whole vectors: no scalar exp tail
  const Vec floor = Splat(kExpFloor);
  for (int64_t h = 0; h < group; ++h) {
    float* row = s + h * stride;
    std::fill(row + context, row + padded, kMasked);  // each adds exp(kExpFloor) ~ 2e-35 to the sum
    Vec top = Splat(kMasked), sum = Splat(0.f);
    for (int64_t t = 0; t < padded; t += kLanes) top = Max(top, Load(row + t));
    top = Splat(ReduceMax(top));
    for (int64_t t = 0; t < padded; t += kLanes) {
      const Vec p = ExpOf(Max(Sub(Load(row + t), top), floor));
      Store(row + t, p);
      sum = Add(sum, p);
    }
    sums[h] = ReduceAdd(sum);
  }
  std::fill(o, o + group * dim, 0.f);
  for (int64_t start = 0; start < context; start += g.block_size) {
    const Cache* v = BlockRows(in.value_cache, g, blocks[start / g.block_size], item.kv_head);
    const int64_t keys = std::min(g.block_size, context - start);
    for (int64_t k = 0; k < keys; k += kLanes) {  // in slices, each prefetching the next one's rows
      const int64_t slice = std::min(kLanes, keys - k);
      if (k + kPrefetchRows < keys)
        PrefetchRows(v + (k + kPrefetchRows) * dim, std::min(kLanes, keys - k - kPrefetchRows), dim);
      AccumulateValues(s + start + k, 1, stride, group, AsFloats(v + k * dim, slice * dim, wide), slice, dim, o);
    }
  }
  float* out = in.out + token * g.num_heads * dim + item.kv_head * group * dim;
  for (int64_t h = 0; h < group; ++h) {
    const float inv = 1.f / sums[h];
    for (int64_t d = 0; d < dim; ++d) out[h * dim + d] = o[h * dim + d] * inv;
  }
}

template void DecodeItem(const Inputs<float>&, const Geometry&, const Item&, Scratch&);
template void DecodeItem(const Inputs<Bf16>&, const Geometry&, const Item&, Scratch&);

}  // namespace fd_attention
