// Append attention on CPU, float32: FastDeploy's `append_attention` step, in our own signature.
//
// One call per layer and step. First this step's K and V rows, taken from the fused qkv
// projection, are written into the paged cache at `slot_mapping`. Then each request's new query
// tokens attend over its cached prefix and its own new tokens, causally: query j of request i
// (position seq_lens_decoder[i] + j) sees keys 0 .. seq_lens_decoder[i] + j. The softmax is exact
// (running max subtracted), accumulation float32. Reference: the pure-Paddle backend in
// fastdeploy/model_executor/layers/attention.py (tests/model_executor/test_append_attention_op.py).
//
// qkv:              [n, (num_heads + 2 * kv_heads) * head_dim], per row: q heads | k heads | v heads,
//                   RoPE already applied to q and k
// key_cache:        [num_blocks, kv_heads, block_size, head_dim], written in place (FastDeploy's layout)
// value_cache:      [num_blocks, kv_heads, block_size, head_dim], written in place
// slot_mapping:     [n] int64, cache slot of each new token = block * block_size + offset
// cu_seqlens_q:     [bs + 1] int64, request i owns rows cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1
// seq_lens_decoder: [bs] int64, tokens of request i in the cache before this step
// block_tables:     [bs, max_blocks] int64, physical blocks of each request, -1 padded
// out:              [n, num_heads * head_dim]
//
// Work items are (request, KV head, query tile); the `group` query heads that share a KV head are
// attended together, so each K/V row is read once per item. A decode item (one query) computes
// all its scores, one softmax, then P.V. A prefill tile of up to 64 query rows runs flash-attention
// style over the key blocks, with scores laid out [key][row] so that both products are
// register-blocked FMAs with broadcast operands and the online softmax vectorises over rows.
// OpenMP threads start only when the step's work is large: waking them costs tens of microseconds.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "paddle/extension.h"
#include "vec_exp.h"

namespace {

constexpr int64_t kLanes = 16;       // floats per vector; head_dim must be a multiple
constexpr int64_t kTileRows = 64;    // query rows (query tokens x group heads) per prefill tile
constexpr float kMasked = -1e30f;    // finite: a running max that starts here minus itself is 0, not inf - inf
constexpr float kExpFloor = -80.f;   // exp arguments are clamped here: exp(-80) ~ 2e-35 adds nothing,
                                     // and lower ones leave the vector exp's fast path
constexpr int64_t kParallelFmas = 1 << 20;  // below this many multiply-adds per call: one thread
constexpr int64_t kPrefetchRows = 32;       // decode: K/V rows read ahead by software prefetch (the
                                            // hardware prefetcher stops at each 4 KB page; a decode
                                            // batch's cache is read once per step, from memory)

// Hint that the `rows` rows of `dim` floats at p will be read soon (one prefetch per cache line).
inline void PrefetchRows(const float* p, int64_t rows, int64_t dim) {
#ifdef __AVX512F__
  const char* bytes = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < rows * dim * 4; b += 64) _mm_prefetch(bytes + b, _MM_HINT_T0);
#endif
}

#ifdef __AVX512F__
using Vec = __m512;
inline Vec Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec Splat(float x) { return _mm512_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline float ReduceAdd(Vec v) { return _mm512_reduce_add_ps(v); }
inline Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec Max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float ReduceMax(Vec v) { return _mm512_reduce_max_ps(v); }
inline Vec ExpOf(Vec v) { return fd_cpu::Exp(v); }
inline Vec Gather(const float* base, const int32_t* offsets) {
  return _mm512_i32gather_ps(_mm512_loadu_si512(offsets), base, sizeof(float));
}
// Lane k of the result = the sum of the lanes of v[k] (a transpose folded into the additions).
inline Vec SumEach(const Vec v[kLanes]) {
  Vec w[8], x[4];
  for (int i = 0; i < 8; ++i)  // 128-bit chunks 0-1: v[2i] folded in half, chunks 2-3: v[2i + 1]
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // chunk j: four partial sums of v[4i + j]
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
  const Vec z0 = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
  const Vec z1 = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
  const Vec sums = _mm512_add_ps(_mm512_shuffle_ps(z0, z1, 0x44), _mm512_shuffle_ps(z0, z1, 0xEE));
  // lane 4j + i now holds the sum of v[4i + j]
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sums);
}
#else  // portable: the same kernels on a 16-float struct, loops the compiler vectorises
struct Vec {
  float x[kLanes];
};
inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(v.x, p, sizeof(v.x));
  return v;
}
inline void Store(float* p, Vec v) { std::memcpy(p, v.x, sizeof(v.x)); }
inline Vec Splat(float s) {
  Vec v;
  for (int64_t i = 0; i < kLanes; ++i) v.x[i] = s;
  return v;
}
inline Vec Fma(Vec a, Vec b, Vec c) {
  for (int64_t i = 0; i < kLanes; ++i) c.x[i] += a.x[i] * b.x[i];
  return c;
}
inline Vec Mul(Vec a, Vec b) {
  for (int64_t i = 0; i < kLanes; ++i) a.x[i] *= b.x[i];
  return a;
}
inline float ReduceAdd(Vec v) {
  float s = 0.f;
  for (int64_t i = 0; i < kLanes; ++i) s += v.x[i];
  return s;
}
inline Vec Add(Vec a, Vec b) {
  for (int64_t i = 0; i < kLanes; ++i) a.x[i] += b.x[i];
  return a;
}
inline Vec Sub(Vec a, Vec b) {
  for (int64_t i = 0; i < kLanes; ++i) a.x[i] -= b.x[i];
  return a;
}
inline Vec Max(Vec a, Vec b) {
  for (int64_t i = 0; i < kLanes; ++i) a.x[i] = std::max(a.x[i], b.x[i]);
  return a;
}
inline float ReduceMax(Vec v) { return *std::max_element(v.x, v.x + kLanes); }
inline Vec ExpOf(Vec v) {
  for (int64_t i = 0; i < kLanes; ++i) v.x[i] = std::exp(v.x[i]);
  return v;
}
inline Vec Gather(const float* base, const int32_t* offsets) {
  Vec v;
  for (int64_t i = 0; i < kLanes; ++i) v.x[i] = base[offsets[i]];
  return v;
}
inline Vec SumEach(const Vec v[kLanes]) {
  Vec sums;
  for (int64_t k = 0; k < kLanes; ++k) sums.x[k] = ReduceAdd(v[k]);
  return sums;
}
#endif

struct Geometry {
  int64_t num_heads, kv_heads, head_dim, group, block_size, max_blocks, qkv_width;
  float scale;
};

struct Inputs {
  const float* qkv;
  float* key_cache;
  float* value_cache;
  const int64_t* cu_seqlens;
  const int64_t* history;  // seq_lens_decoder
  const int64_t* block_tables;
  float* out;
};

// Per-thread buffers, reused across items and calls.
struct Scratch {
  std::vector<float> floats;
  std::vector<int32_t> offsets;
};

// One work item: query tokens first .. first + count - 1 of `request` against KV head `kv_head`.
struct Item {
  int64_t request, kv_head, first, count;
  int64_t fmas;  // multiply-adds of both products, for scheduling
};

inline const float* QueryRow(const Inputs& in, const Geometry& g, int64_t token, int64_t head) {
  return in.qkv + token * g.qkv_width + head * g.head_dim;
}

// K (or V) rows of cache block `block`, KV head `kv_head`: [block_size, head_dim].
inline float* BlockRows(float* cache, const Geometry& g, int64_t block, int64_t kv_head) {
  return cache + (block * g.kv_heads + kv_head) * g.block_size * g.head_dim;
}

void WriteCache(const Inputs& in, const Geometry& g, const int64_t* slots, int64_t n) {
  const size_t bytes = g.head_dim * sizeof(float);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t block = slots[t] / g.block_size, offset = (slots[t] % g.block_size) * g.head_dim;
    for (int64_t h = 0; h < g.kv_heads; ++h) {
      std::memcpy(BlockRows(in.key_cache, g, block, h) + offset, QueryRow(in, g, t, g.num_heads + h), bytes);
      std::memcpy(BlockRows(in.value_cache, g, block, h) + offset,
                  QueryRow(in, g, t, g.num_heads + g.kv_heads + h), bytes);
    }
  }
}

// o[r] += sum_k p[k * key_stride + r * row_stride] * v[k], rows r0 .. r0 + NR - 1, columns d0 .. d0 + 16 NV.
// o: [rows, head_dim]; v: [keys, head_dim].
template <int NR, int NV>
void AccumulateTile(const float* p, int64_t key_stride, int64_t row_stride, const float* v, int64_t keys,
                    int64_t head_dim, float* o) {
  Vec acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = Load(o + r * head_dim + j * kLanes);
  for (int64_t k = 0; k < keys; ++k, v += head_dim, p += key_stride) {
    Vec vk[NV];
    for (int j = 0; j < NV; ++j) vk[j] = Load(v + j * kLanes);
    for (int r = 0; r < NR; ++r) {
      const Vec pr = Splat(p[r * row_stride]);
      for (int j = 0; j < NV; ++j) acc[r][j] = Fma(pr, vk[j], acc[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NV; ++j) Store(o + r * head_dim + j * kLanes, acc[r][j]);
}

template <int NR>
void AccumulateRows(const float* p, int64_t key_stride, int64_t row_stride, const float* v, int64_t keys,
                    int64_t head_dim, float* o) {
  for (int64_t d = 0; d < head_dim; d += 4 * kLanes) {
    switch (std::min<int64_t>(4, (head_dim - d) / kLanes)) {
      case 4: AccumulateTile<NR, 4>(p, key_stride, row_stride, v + d, keys, head_dim, o + d); break;
      case 3: AccumulateTile<NR, 3>(p, key_stride, row_stride, v + d, keys, head_dim, o + d); break;
      case 2: AccumulateTile<NR, 2>(p, key_stride, row_stride, v + d, keys, head_dim, o + d); break;
      default: AccumulateTile<NR, 1>(p, key_stride, row_stride, v + d, keys, head_dim, o + d); break;
    }
  }
}

// o[r] += sum_k p(k, r) * v[k] for rows 0 .. rows - 1: the P.V product of one key block.
void AccumulateValues(const float* p, int64_t key_stride, int64_t row_stride, int64_t rows, const float* v,
                      int64_t keys, int64_t head_dim, float* o) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    AccumulateRows<4>(p + r * row_stride, key_stride, row_stride, v, keys, head_dim, o + r * head_dim);
  const float* pr = p + r * row_stride;
  float* orow = o + r * head_dim;
  switch (rows - r) {
    case 3: AccumulateRows<3>(pr, key_stride, row_stride, v, keys, head_dim, orow); break;
    case 2: AccumulateRows<2>(pr, key_stride, row_stride, v, keys, head_dim, orow); break;
    case 1: AccumulateRows<1>(pr, key_stride, row_stride, v, keys, head_dim, orow); break;
    default: break;
  }
}

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
void DecodeScores(const float* q, int64_t group, const float* keys, int64_t count, int64_t block_size,
                  int64_t dim, float* s, int64_t stride) {
  int64_t k = 0;
  for (; k < count && k + kLanes <= block_size; k += kLanes) {
    if (k + kPrefetchRows < count) PrefetchRows(keys + (k + kPrefetchRows) * dim, kLanes, dim);
    for (int64_t h = 0; h < group; ++h) Dot16(q + h * dim, keys + k * dim, dim, s + h * stride + k);
  }
  for (; k < count; ++k)
    for (int64_t h = 0; h < group; ++h) s[h * stride + k] = Dot(q + h * dim, keys + k * dim, dim);
}

// One query token of request i, the `group` heads of KV head h: scores, exact softmax, P.V.
void DecodeItem(const Inputs& in, const Geometry& g, const Item& item, Scratch& scratch) {
  const int64_t dim = g.head_dim, group = g.group, token = in.cu_seqlens[item.request];
  const int64_t context = in.history[item.request] + 1;
  const int64_t* blocks = in.block_tables + item.request * g.max_blocks;
  const int64_t stride = context + kLanes;  // room for a last partial 16 (scores or padding)
  scratch.floats.resize(group * (2 * dim + stride + 1));
  float* q = scratch.floats.data();      // [group, dim], scaled
  float* o = q + group * dim;     // [group, dim]
  float* sums = o + group * dim;  // [group]
  float* s = sums + group;        // [group, stride]
  const float* q_in = QueryRow(in, g, token, item.kv_head * group);
  for (int64_t i = 0; i < group * dim; ++i) q[i] = q_in[i] * g.scale;
  for (int64_t start = 0; start < context; start += g.block_size) {
    const float* k = BlockRows(in.key_cache, g, blocks[start / g.block_size], item.kv_head);
    DecodeScores(q, group, k, std::min(g.block_size, context - start), g.block_size, dim, s + start, stride);
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
    const float* v = BlockRows(in.value_cache, g, blocks[start / g.block_size], item.kv_head);
    const int64_t keys = std::min(g.block_size, context - start);
    for (int64_t k = 0; k < keys; k += kLanes) {  // in slices, each prefetching the next one's rows
      const int64_t slice = std::min(kLanes, keys - k);
      if (k + kPrefetchRows < keys)
        PrefetchRows(v + (k + kPrefetchRows) * dim, std::min(kLanes, keys - k - kPrefetchRows), dim);
      AccumulateValues(s + start + k, 1, stride, group, v + k * dim, slice, dim, o);
    }
  }
  float* out = in.out + token * g.num_heads * dim + item.kv_head * group * dim;
  for (int64_t h = 0; h < group; ++h) {
    const float inv = 1.f / sums[h];
    for (int64_t d = 0; d < dim; ++d) out[h * dim + d] = o[h * dim + d] * inv;
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

// Every request's items, heaviest first (threads then take them in turn: longest first balances
// a long prompt's tiles against many short decodes); *fmas: the sum of their multiply-adds.
std::vector<Item> MakeItems(const Inputs& in, const Geometry& g, int64_t batch, int64_t* fmas) {
  std::vector<Item> items;
  const int64_t tile = std::max<int64_t>(1, kTileRows / g.group);
  *fmas = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t queries = in.cu_seqlens[i + 1] - in.cu_seqlens[i];
    for (int64_t first = 0; first < queries; first += tile) {
      const int64_t count = std::min(tile, queries - first);
      const int64_t cost = 2 * count * g.group * (in.history[i] + first + count) * g.head_dim;
      for (int64_t h = 0; h < g.kv_heads; ++h) items.push_back({i, h, first, count, cost});
      *fmas += cost * g.kv_heads;
    }
  }
  if (*fmas > kParallelFmas)
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.fmas > b.fmas; });
  return items;
}

void CheckInputs(const paddle::Tensor& qkv, const paddle::Tensor& key_cache, const paddle::Tensor& value_cache,
                 const paddle::Tensor& slot_mapping, const paddle::Tensor& cu_seqlens_q,
                 const paddle::Tensor& seq_lens_decoder, const paddle::Tensor& block_tables, const Geometry& g) {
  PD_CHECK(qkv.is_cpu() && key_cache.is_cpu() && value_cache.is_cpu(), "append_attention runs on CPU tensors");
  PD_CHECK(qkv.dtype() == paddle::DataType::FLOAT32 && key_cache.dtype() == paddle::DataType::FLOAT32 &&
               value_cache.dtype() == paddle::DataType::FLOAT32,
           "append_attention: qkv and the caches must be float32");
  for (const paddle::Tensor* t : {&slot_mapping, &cu_seqlens_q, &seq_lens_decoder, &block_tables})
    PD_CHECK(t->dtype() == paddle::DataType::INT64, "append_attention: index inputs must be int64");
  PD_CHECK(g.kv_heads > 0 && g.num_heads > 0 && g.num_heads % g.kv_heads == 0, "append_attention: num_heads (",
           g.num_heads, ") must be a positive multiple of the caches' kv_heads (", g.kv_heads, ")");
  PD_CHECK(g.head_dim % kLanes == 0, "append_attention: head_dim (", g.head_dim, ") must be a multiple of 16");
  PD_CHECK(qkv.shape().size() == 2 && qkv.shape()[1] == g.qkv_width, "append_attention: qkv must be [n, ",
           g.qkv_width, "] = [n, (num_heads + 2 * kv_heads) * head_dim] for num_heads ", g.num_heads, ", kv_heads ",
           g.kv_heads, ", head_dim ", g.head_dim);
  PD_CHECK(key_cache.shape() == value_cache.shape(), "append_attention: key and value caches differ in shape");
  PD_CHECK(g.block_size % 4 == 0, "append_attention: block_size (", g.block_size, ") must be a multiple of 4");
  const int64_t batch = seq_lens_decoder.numel();
  PD_CHECK(cu_seqlens_q.numel() == batch + 1 && block_tables.shape().size() == 2 && block_tables.shape()[0] == batch,
           "append_attention: cu_seqlens_q must be [bs + 1] and block_tables [bs, max_blocks] for bs = ", batch);
  const int64_t* cu = cu_seqlens_q.data<int64_t>();
  const int64_t* history = seq_lens_decoder.data<int64_t>();
  const int64_t* tables = block_tables.data<int64_t>();
  const int64_t num_blocks = key_cache.shape()[0], n = qkv.shape()[0];
  PD_CHECK(cu[0] == 0 && cu[batch] == n && slot_mapping.numel() == n,
           "append_attention: cu_seqlens_q must run from 0 to the number of qkv rows, one slot per row");
  for (int64_t i = 0; i < batch; ++i) {
    PD_CHECK(cu[i + 1] >= cu[i] && history[i] >= 0, "append_attention: bad lengths for request ", i);
    const int64_t needed = (history[i] + cu[i + 1] - cu[i] + g.block_size - 1) / g.block_size;
    PD_CHECK(needed <= g.max_blocks, "append_attention: request ", i, " needs ", needed, " blocks, its table has ",
             g.max_blocks);
    for (int64_t b = 0; b < needed; ++b)
      PD_CHECK(tables[i * g.max_blocks + b] >= 0 && tables[i * g.max_blocks + b] < num_blocks,
               "append_attention: request ", i, " has block id ", tables[i * g.max_blocks + b], " outside [0, ",
               num_blocks, ")");
  }
  const int64_t* slots = slot_mapping.data<int64_t>();
  for (int64_t t = 0; t < n; ++t)
    PD_CHECK(slots[t] >= 0 && slots[t] < num_blocks * g.block_size, "append_attention: slot ", slots[t],
             " of row ", t, " is outside the cache");
}

}  // namespace

std::vector<paddle::Tensor> AppendAttention(const paddle::Tensor& qkv, const paddle::Tensor& key_cache,
                                            const paddle::Tensor& value_cache, const paddle::Tensor& slot_mapping,
                                            const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder,
                                            const paddle::Tensor& block_tables, int num_heads, float scale) {
  PD_CHECK(key_cache.shape().size() == 4 && block_tables.shape().size() == 2,
           "append_attention: caches must be 4-D and block_tables 2-D");
  const int64_t kv_heads = key_cache.shape()[1], head_dim = key_cache.shape()[3];
  const Geometry g{num_heads, kv_heads, head_dim, num_heads / std::max<int64_t>(kv_heads, 1), key_cache.shape()[2],
                   block_tables.shape()[1], (num_heads + 2 * kv_heads) * head_dim, scale};
  CheckInputs(qkv, key_cache, value_cache, slot_mapping, cu_seqlens_q, seq_lens_decoder, block_tables, g);
  const int64_t n = qkv.shape()[0], batch = seq_lens_decoder.numel();
  auto out = paddle::empty({n, g.num_heads * g.head_dim}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  // The caches are written through their data pointers: Paddle's inplace map would say so too, but
  // costs ~3.5 us more per call (a quarter of a batch-1 decode call), and nothing here records graphs.
  // Paddle hands a kernel a contiguous copy of a strided input, so the caches must be contiguous
  // tensors for the writes to land (ops/attention.py checks).
  const Inputs in{qkv.data<float>(),
                  const_cast<float*>(key_cache.data<float>()),
                  const_cast<float*>(value_cache.data<float>()),
                  cu_seqlens_q.data<int64_t>(),
                  seq_lens_decoder.data<int64_t>(),
                  block_tables.data<int64_t>(),
                  out.data<float>()};
  WriteCache(in, g, slot_mapping.data<int64_t>(), n);
  int64_t fmas = 0;
  const std::vector<Item> items = MakeItems(in, g, batch, &fmas);
  const int64_t count = static_cast<int64_t>(items.size());
  // Items are handed out by an atomic counter, not `omp for schedule(dynamic)`, which would run every
  // item on every thread (custom_ops/README.md, "OpenMP runtime").
  std::atomic<int64_t> next{0};
#pragma omp parallel if (fmas > kParallelFmas)
  {
    Scratch scratch;
    for (int64_t i = next++; i < count; i = next++) {
      const Item& item = items[i];
      if (in.cu_seqlens[item.request + 1] - in.cu_seqlens[item.request] == 1) {
        DecodeItem(in, g, item, scratch);
      } else {
        PrefillItem(in, g, item, scratch);
      }
    }
  }
  return {out};
}

std::vector<std::vector<int64_t>> AppendAttentionInferShape(const std::vector<int64_t>& qkv,
                                                            const std::vector<int64_t>& key_cache,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&, int num_heads, float) {
  return {{qkv[0], num_heads * key_cache[3]}};
}

std::vector<paddle::DataType> AppendAttentionInferDtype(const paddle::DataType& qkv, const paddle::DataType&,
                                                        const paddle::DataType&, const paddle::DataType&,
                                                        const paddle::DataType&, const paddle::DataType&,
                                                        const paddle::DataType&) {
  return {qkv};
}

PD_BUILD_OP(append_attention)
    .Inputs({"QKV", "KeyCache", "ValueCache", "SlotMapping", "CuSeqlensQ", "SeqLensDecoder", "BlockTables"})
    .Outputs({"Out"})
    .Attrs({"num_heads: int", "scale: float"})
    .SetKernelFn(PD_KERNEL(AppendAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(AppendAttentionInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AppendAttentionInferDtype));
