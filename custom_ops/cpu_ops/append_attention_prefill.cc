// append_attention's prefill item (a request with several new tokens: a prompt, or a chunk of one
// after its cached history): a tile of up to 64 query rows (tokens x group heads) runs
// flash-attention style over the key blocks, scores laid out [key][row] so both products are
// register-blocked FMAs with broadcast operands, the online softmax vectorised over rows, the causal
// mask applied per block.
#include <algorithm>
#include <cstdint>

#include "append_attention_common.h"

namespace fd_attention {
namespace {

// s[k][r] = sum_d keys[k][d] * qt[d][r] for keys k0 .. k0 + NK - 1 and rows r0 .. r0 + 16 NV - 1.
// keys: [*, head_dim]; qt: [head_dim, rp]; s: [*, rp].
template <int NK, int NV>
void ScoreTile(const float* keys, const float* qt, int64_t rp, int64_t head_dim, float* s) {
  Vec acc[NK][NV];
  for (int k = 0; k < NK; ++k)
    for (int j = 0; j < NV; ++j) acc[k][j] = Splat(0.f);
  for (int64_t d = 0; d < head_dim; ++d, qt += rp) {
    Vec q[NV];
    for (int j = 0; j < NV; ++j) q[j] = Load(qt + j * kLanes);
    for (int k = 0; k < NK; ++k) {
      const Vec kd = Splat(keys[k * head_dim + d]);
      for (int j = 0; j < NV; ++j) acc[k][j] = Fma(kd, q[j], acc[k][j]);
    }
  }
  for (int k = 0; k < NK; ++k)
    for (int j = 0; j < NV; ++j) Store(s + k * rp + j * kLanes, acc[k][j]);
}

template <int NV>
void ScoreColumns(const float* keys, int64_t num_keys, const float* qt, int64_t rp, int64_t head_dim, float* s) {
  for (int64_t k = 0; k < num_keys; k += 4) ScoreTile<4, NV>(keys + k * head_dim, qt, rp, head_dim, s + k * rp);
}

// s: [num_keys, rp] = keys [num_keys, head_dim] . qt [head_dim, rp]; num_keys a multiple of 4.
void ScoreBlock(const float* keys, int64_t num_keys, const float* qt, int64_t rp, int64_t head_dim, float* s) {
  for (int64_t r = 0; r < rp; r += 4 * kLanes) {
    switch (std::min<int64_t>(4, (rp - r) / kLanes)) {
      case 4: ScoreColumns<4>(keys, num_keys, qt + r, rp, head_dim, s + r); break;
      case 3: ScoreColumns<3>(keys, num_keys, qt + r, rp, head_dim, s + r); break;
      case 2: ScoreColumns<2>(keys, num_keys, qt + r, rp, head_dim, s + r); break;
      default: ScoreColumns<1>(keys, num_keys, qt + r, rp, head_dim, s + r); break;
    }
  }
}

// Online softmax step over one key block, vectorised over rows. s: [keys, rp] scores -> probabilities
// relative to the new running max; m, l: [rp] running max and sum; o: [rp, dim] rescaled.
void SoftmaxStep(float* s, int64_t keys, int64_t rp, int64_t dim, float* m, float* l, float* alpha, float* o) {
  // rp is a multiple of kLanes: every loop over rows runs on whole vectors
  const Vec floor = Splat(kExpFloor);
  for (int64_t r = 0; r < rp; r += kLanes) {
    Vec top = Load(m + r);
    for (int64_t k = 0; k < keys; ++k) top = Max(top, Load(s + k * rp + r));
    const Vec a = ExpOf(Max(Sub(Load(m + r), top), floor));
    Store(alpha + r, a);
    Store(m + r, top);
    Vec sum = Mul(Load(l + r), a);
    for (int64_t k = 0; k < keys; ++k) {
      const Vec p = ExpOf(Max(Sub(Load(s + k * rp + r), top), floor));
      Store(s + k * rp + r, p);
      sum = Add(sum, p);
    }
    Store(l + r, sum);
  }
  for (int64_t r = 0; r < rp; ++r)
    for (int64_t d = 0; d < dim; ++d) o[r * dim + d] *= alpha[r];
}

}  // namespace

// Query tokens first .. first + count - 1 of request i (rows = count x group heads) against KV head h.
void PrefillItem(const Inputs& in, const Geometry& g, const Item& item, Scratch& scratch) {
  const int64_t dim = g.head_dim, group = g.group, bs = g.block_size;
  const int64_t rows = item.count * group, rp = (rows + kLanes - 1) / kLanes * kLanes;
  const int64_t first_pos = in.history[item.request] + item.first, last_key = first_pos + item.count - 1;
  const int64_t token0 = in.cu_seqlens[item.request] + item.first;
  const int64_t* blocks = in.block_tables + item.request * g.max_blocks;
  scratch.floats.resize(rp * (2 * dim + bs + 4));
  scratch.offsets.resize(rp);
  float* qt = scratch.floats.data();  // [dim, rp] scaled queries, transposed
  float* o = qt + dim * rp;           // [rp, dim]
  float* s = o + rp * dim;            // [bs, rp]
  float* m = s + bs * rp;             // [rp] running max
  float* l = m + rp;                  // [rp] running sum
  float* alpha = l + rp;              // [rp] rescaling factor; first the scale of each row
  float* pos = alpha + rp;            // [rp] query position of each row
  int32_t* offsets = scratch.offsets.data();  // [rp] each row's query, from the first row's
  for (int64_t r = 0; r < rp; ++r) {  // rows past `rows` repeat the last one, scaled by 0
    const int64_t real = std::min(r, rows - 1);
    offsets[r] = static_cast<int32_t>(real / group * g.qkv_width + real % group * dim);
    alpha[r] = r < rows ? g.scale : 0.f;
    pos[r] = static_cast<float>(first_pos + real / group);
    m[r] = kMasked;
    l[r] = 0.f;
  }
  const float* q0 = QueryRow(in, g, token0, item.kv_head * group);
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t r = 0; r < rp; r += kLanes)
      Store(qt + d * rp + r, Mul(Gather(q0 + d, offsets + r), Load(alpha + r)));
  std::fill(o, o + rp * dim, 0.f);
  for (int64_t start = 0; start <= last_key; start += bs) {
    const int64_t block = blocks[start / bs];
    const int64_t keys = std::min(bs, last_key + 1 - start), padded = (keys + 3) / 4 * 4;
    ScoreBlock(BlockRows(in.key_cache, g, block, item.kv_head), padded, qt, rp, dim, s);
    if (start + padded - 1 > first_pos) {  // causal mask; also masks the padding keys past last_key
      for (int64_t k = 0; k < padded; ++k) {
        const float key_pos = static_cast<float>(start + k);
        float* row = s + k * rp;
#pragma omp simd
        for (int64_t r = 0; r < rp; ++r) row[r] = key_pos > pos[r] ? kMasked : row[r];
      }
    }
    SoftmaxStep(s, padded, rp, dim, m, l, alpha, o);
    AccumulateValues(s, rp, 1, rows, BlockRows(in.value_cache, g, block, item.kv_head), keys, dim, o);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* out = in.out + (token0 + r / group) * g.num_heads * dim + (item.kv_head * group + r % group) * dim;
    const float inv = 1.f / l[r];
    for (int64_t d = 0; d < dim; ++d) out[d] = o[r * dim + d] * inv;
  }
}

}  // namespace fd_attention
