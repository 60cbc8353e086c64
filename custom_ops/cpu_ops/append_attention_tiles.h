// The flash-attention tile kernels of append_attention's prefill item (ScoreTile shared with vision_attention):
// scores of a key block against a tile of up to 64 query rows held transposed (laid out [key][row],
// register-blocked FMAs with broadcast operands), and the online-softmax step over one block,
// vectorised over rows.
#pragma once
#include <algorithm>
#include <cstdint>

#include "append_attention_common.h"

namespace fd_attention {

// s[k][r] = sum_d keys[k][d] * qt[d][r] for keys k0 .. k0 + NK - 1 and rows r0 .. r0 + 16 NV - 1.
// keys: [*, head_dim]; qt: [head_dim, rp]; s: [*, rp].
template <int NK, int NV>
inline void ScoreTile(const float* keys, const float* qt, int64_t rp, int64_t head_dim, float* s) {
  Vec acc[NK][NV];
  for (int k = 0; k < NK; ++k)
    for (int j = 0; j < NV; ++j) acc[k][j] = Splat(0.f);
#pragma GCC unroll 2  // halves the loop overhead that shares the vector ports
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
inline void ScoreColumns(const float* keys, int64_t num_keys, const float* qt, int64_t rp, int64_t head_dim, float* s) {
  for (int64_t k = 0; k < num_keys; k += 4) ScoreTile<4, NV>(keys + k * head_dim, qt, rp, head_dim, s + k * rp);
}

// s: [num_keys, rp] = keys [num_keys, head_dim] . qt [head_dim, rp]; num_keys a multiple of 4.
inline void ScoreBlock(const float* keys, int64_t num_keys, const float* qt, int64_t rp, int64_t head_dim, float* s) {
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
inline void SoftmaxStep(float* s, int64_t keys, int64_t rp, int64_t dim, float* m, float* l, float* alpha, float* o) {
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

}  // namespace fd_attention
