// What append_attention's files share (append_attention.cc: the op; append_attention_decode.cc and
// append_attention_prefill.cc: the two kinds of work item): the tuning constants, the geometry and
// pointers of one call, a work item and per-thread scratch, row addressing into qkv and the paged
// caches, and the register-blocked P.V product both item kinds end with. The caches hold float32 or
// bf16 (Bf16, append_attention_vec.h): the items are templates on the element type `Cache` and hand
// their float32 kernels the cache rows through AsFloats (a bf16 slice widened once into scratch, not
// once per query head or row tile that reads it).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "append_attention_vec.h"

namespace fd_attention {

constexpr int64_t kTileRows = 64;    // query rows (query tokens x group heads) per prefill tile
constexpr float kMasked = -1e30f;    // finite: a running max that starts here minus itself is 0, not inf - inf
constexpr float kExpFloor = -80.f;   // exp arguments are clamped here: exp(-80) ~ 2e-35 adds nothing,
                                     // and lower ones leave the vector exp's fast path
constexpr int64_t kParallelFmas = 1 << 20;  // below this many multiply-adds per call: one thread
constexpr int64_t kPrefetchRows = 32;       // decode: K/V rows read ahead by software prefetch (the
                                            // hardware prefetcher stops at each 4 KB page; a decode
                                            // batch's cache is read once per step, from memory)

struct NoHint {  // the P.V kernels' per-step hook where the caller has nothing to do (prefill)
  void operator()() const {}
};

// The kernels a call may run for a bf16 cache's decode items (the `kernel` attribute, resolved to what
// this build and CPU have: AMX only where compiled and granted by Linux).
enum Kernel { kBest = 0, kNoAmx = 1 };

struct Geometry {
  int64_t num_heads, kv_heads, head_dim, group, block_size, max_blocks, qkv_width;
  float scale;
  int64_t kernel;  // Kernel, resolved
};

template <typename Cache>  // float or Bf16
struct Inputs {
  const float* qkv;
  Cache* key_cache;
  Cache* value_cache;
  const int64_t* cu_seqlens;
  const int64_t* history;  // seq_lens_decoder
  const int64_t* block_tables;
  float* out;
};

// Per-thread buffers, reused across items and calls.
struct Scratch {
  std::vector<float> floats;
  std::vector<int32_t> offsets;
  bool tiles = false;  // this thread's AMX tiles are configured (released when its items are done)

  // The AMX decode's bf16 operands: at least n values, not initialised (a long context's value pairs
  // are megabytes, every one written before it is read).
  Bf16* Halves(int64_t n) {
    if (n > halves_size) {
      halves.reset(new Bf16[n]);
      halves_size = n;
    }
    return halves.get();
  }

 private:
  std::unique_ptr<Bf16[]> halves;
  int64_t halves_size = 0;
};

// One work item: query tokens first .. first + count - 1 of `request` against KV head `kv_head`.
struct Item {
  int64_t request, kv_head, first, count;
  int64_t fmas;  // multiply-adds of both products, for scheduling
};

// A decode item: its request has one new token this step.
template <typename Cache>
inline bool IsDecode(const Inputs<Cache>& in, const Item& item) {
  return in.cu_seqlens[item.request + 1] - in.cu_seqlens[item.request] == 1;
}

template <typename Cache>
inline const float* QueryRow(const Inputs<Cache>& in, const Geometry& g, int64_t token, int64_t head) {
  return in.qkv + token * g.qkv_width + head * g.head_dim;
}

// K (or V) rows of cache block `block`, KV head `kv_head`: [block_size, head_dim].
template <typename Cache>
inline Cache* BlockRows(Cache* cache, const Geometry& g, int64_t block, int64_t kv_head) {
  return cache + (block * g.kv_heads + kv_head) * g.block_size * g.head_dim;
}

// The n cache values at p (n a multiple of 16) as float32: p itself for a float32 cache; bf16 ones
// widened (exactly) into wide[n].
inline const float* AsFloats(const float* p, int64_t, float*) { return p; }
inline const float* AsFloats(const Bf16* p, int64_t n, float* wide) {
  for (int64_t i = 0; i < n; i += kLanes) Store(wide + i, Load(p + i));
  return wide;
}

// o[r] += sum_k p[k * key_stride + r * row_stride] * v[k], rows r0 .. r0 + NR - 1, columns d0 .. d0 + 16 NV.
// o: [rows, head_dim]; v: [keys, head_dim].
// hint() once per key (decode: its prefetches).
template <int NR, int NV, typename Hint>
void AccumulateTile(const float* p, int64_t key_stride, int64_t row_stride, const float* v, int64_t keys,
                    int64_t head_dim, float* o, const Hint& hint) {
  Vec acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = Load(o + r * head_dim + j * kLanes);
  for (int64_t k = 0; k < keys; ++k, v += head_dim, p += key_stride) {
    hint();
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

template <int NR, typename Hint>
void AccumulateRows(const float* p, int64_t key_stride, int64_t row_stride, const float* v, int64_t keys,
                    int64_t head_dim, float* o, const Hint& hint) {
  for (int64_t d = 0; d < head_dim; d += 4 * kLanes) {
    switch (std::min<int64_t>(4, (head_dim - d) / kLanes)) {
      case 4: AccumulateTile<NR, 4>(p, key_stride, row_stride, v + d, keys, head_dim, o + d, hint); break;
      case 3: AccumulateTile<NR, 3>(p, key_stride, row_stride, v + d, keys, head_dim, o + d, hint); break;
      case 2: AccumulateTile<NR, 2>(p, key_stride, row_stride, v + d, keys, head_dim, o + d, hint); break;
      default: AccumulateTile<NR, 1>(p, key_stride, row_stride, v + d, keys, head_dim, o + d, hint); break;
    }
  }
}

// o[r] += sum_k p(k, r) * v[k] for rows 0 .. rows - 1: the P.V product of one key block.
template <typename Hint = NoHint>
void AccumulateValues(const float* p, int64_t key_stride, int64_t row_stride, int64_t rows, const float* v,
                      int64_t keys, int64_t head_dim, float* o, const Hint& hint = Hint()) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    AccumulateRows<4>(p + r * row_stride, key_stride, row_stride, v, keys, head_dim, o + r * head_dim, hint);
  const float* pr = p + r * row_stride;
  float* orow = o + r * head_dim;
  switch (rows - r) {
    case 3: AccumulateRows<3>(pr, key_stride, row_stride, v, keys, head_dim, orow, hint); break;
    case 2: AccumulateRows<2>(pr, key_stride, row_stride, v, keys, head_dim, orow, hint); break;
    case 1: AccumulateRows<1>(pr, key_stride, row_stride, v, keys, head_dim, orow, hint); break;
    default: break;
  }
}

// append_attention_decode.cc: one query token of a request, the `group` heads of one KV head
// (instantiated there for float and Bf16 caches).
template <typename Cache>
void DecodeItem(const Inputs<Cache>& in, const Geometry& g, const Item& item, const Item* following,
                Scratch& scratch);

// append_attention_prefill.cc: a tile of a request's query tokens (x group heads) against one KV head.
template <typename Cache>
void PrefillItem(const Inputs<Cache>& in, const Geometry& g, const Item& item, Scratch& scratch);

}  // namespace fd_attention
