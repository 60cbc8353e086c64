// append_attention's prefill item (a request with several new tokens: a prompt, or a chunk of one
// after its cached history): a tile of up to 64 query rows (tokens x group heads) runs
// flash-attention style over the key blocks, scores laid out [key][row] so both products are
// register-blocked FMAs with broadcast operands, the online softmax vectorised over rows, the causal
// mask applied per block.
#include <algorithm>
#include <cstdint>

#include "append_attention_common.h"
#include "append_attention_tiles.h"

namespace fd_attention {

// Query tokens first .. first + count - 1 of request i (rows = count x group heads) against KV head h.
template <typename Cache>
void PrefillItem(const Inputs<Cache>& in, const Geometry& g, const Item& item, Scratch& scratch) {
  const int64_t dim = g.head_dim, group = g.group, bs = g.block_size;
  const int64_t rows = item.count * group, rp = (rows + kLanes - 1) / kLanes * kLanes;
  const int64_t first_pos = in.history[item.request] + item.first, last_key = first_pos + item.count - 1;
  const int64_t token0 = in.cu_seqlens[item.request] + item.first;
  const int64_t* blocks = in.block_tables + item.request * g.max_blocks;
  scratch.floats.resize(rp * (2 * dim + bs + 4) + bs * dim);
  scratch.offsets.resize(rp);
  float* qt = scratch.floats.data();  // [dim, rp] scaled queries, transposed
  float* o = qt + dim * rp;           // [rp, dim]
  float* s = o + rp * dim;            // [bs, rp]
  float* m = s + bs * rp;             // [rp] running max
  float* l = m + rp;                  // [rp] running sum
  float* alpha = l + rp;              // [rp] rescaling factor; first the scale of each row
  float* pos = alpha + rp;            // [rp] query position of each row
  float* wide = pos + rp;             // [bs, dim]: a bf16 cache block widened
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
    ScoreBlock(AsFloats(BlockRows(in.key_cache, g, block, item.kv_head), padded * dim, wide), padded, qt, rp, dim, s);
    if (start + padded - 1 > first_pos) {  // causal mask; also masks the padding keys past last_key
      for (int64_t k = 0; k < padded; ++k) {
        const float key_pos = static_cast<float>(start + k);
        float* row = s + k * rp;
#pragma omp simd
        for (int64_t r = 0; r < rp; ++r) row[r] = key_pos > pos[r] ? kMasked : row[r];
      }
    }
    SoftmaxStep(s, padded, rp, dim, m, l, alpha, o);
    AccumulateValues(s, rp, 1, rows, AsFloats(BlockRows(in.value_cache, g, block, item.kv_head), keys * dim, wide),
                     keys, dim, o);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* out = in.out + (token0 + r / group) * g.num_heads * dim + (item.kv_head * group + r % group) * dim;
    const float inv = 1.f / l[r];
    for (int64_t d = 0; d < dim; ++d) out[d] = o[r * dim + d] * inv;
  }
}

template void PrefillItem(const Inputs<float>&, const Geometry&, const Item&, Scratch&);
template void PrefillItem(const Inputs<Bf16>&, const Geometry&, const Item&, Scratch&);

}  // namespace fd_attention
