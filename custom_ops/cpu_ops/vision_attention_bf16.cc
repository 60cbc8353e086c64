// vision_attention_bf16: vision_attention.cc's attention (non-causal, within segments, from the fused
// qkv [n, 3 * heads * head_dim], out [n, heads * head_dim] float32) with bf16 products, for a vision
// tower that computes in bf16: q, k, v rounded to bf16 (round to nearest even), S = q k^T summed in
// float32 and scaled in float32, an exact online softmax in float32 (running max subtracted, sum of the
// float32 probabilities), P rounded to bf16, O += P V summed in float32, O / sum at the end. These are
// the numerics of PyTorch's CPU flash attention for bf16 inputs (aten/src/ATen/native/cpu/
// FlashAttentionKernel.cpp) and of FlashAttention's blocking (Dao et al. 2022).
//
// Layout. K and V are rounded once per (segment, head) into shared buffers, the segment's keys padded
// with zeros to a multiple of 32: K as [keys / 16, head_dim' / 2, 16, 2] (16 keys' pairs of dims per
// 64-byte row: AMX's B tile for S, vdpbf16ps's operand), head_dim' = head_dim rounded up to 32 with zero
// dims; V as [keys / 2, head_dim, 2] (a key pair's values per dim: the B tile for P V). A work item is
// (segment, head, 32 queries), from an atomic counter; per block of up to 128 keys it computes S [32,
// block], the softmax step row by row, P [32, block] bf16, and O [32, head_dim] float32 = alpha O + P V.
// Kernels for the two products (`kernel`: 0 the best compiled, 1 not AMX, 2 portable):
//   * AMX-BF16 (compiled with -march=native on a CPU that has it; used when Linux grants the tile state):
//     S as 32 x 32 blocks of 2 x 2 accumulator tiles over head_dim' / 32 steps; P V as 32 x 32 (x 16)
//     blocks of O tiles loaded, accumulated over the block's keys, stored.
//   * AVX512-BF16: register tiles, 8 query rows x 32 keys for S and 4 rows x up to 64 dims for P V, each
//     `vdpbf16ps` adding a pair of products into float32 lanes.
//   * portable: plain loops over the same bf16 values (the tests run it on every CPU).
// head_dim must be a multiple of 16.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "append_attention_common.h"
#include "bf16.h"
#include "paddle/extension.h"

namespace fd_vision_bf16 {
namespace {

using fd_attention::Vec;
using fd_cpu::Bf16ToFloat;  // bf16.h
using fd_cpu::RoundRow;

constexpr int64_t kRows = 32;      // queries per item
constexpr int64_t kBlock = 128;    // keys per online-softmax step
constexpr int64_t kKeyPad = 32;    // a segment's keys are padded to a multiple of this
constexpr float kNoMax = -1e30f;   // finite: the first step's exp(kNoMax - max) is 0
enum Kernel { kBest = 0, kNoAmx = 1, kPortable = 2 };

struct Item {
  int64_t segment, head, first, count;  // queries first .. first + count - 1 of the segment
};

struct Segment {
  int64_t start, length, padded, offset;  // rows start .. start + length - 1; keys padded; buffer offset in keys
};

inline void StoreBf16(uint16_t* y, Vec v) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  const __m256bh h = _mm512_cvtneps_pbh(v);
  std::memcpy(y, &h, 32);
#else
  float x[fd_attention::kLanes];
  fd_attention::Store(x, v);
  RoundRow(x, fd_attention::kLanes, y);
#endif
}

// Rows of qkv are 3 x heads x head_dim floats apart, so the hardware prefetcher does not follow a head's
// slices down the rows: PackKeysValues prefetches kAheadRows rows ahead (measured: 4 rows beat 8 and none; the queries' rows, read per item, gained nothing from it).
constexpr int64_t kAheadRows = 4;

inline void PrefetchFloats(const float* p, int64_t n) {
#ifdef __AVX512F__
  for (int64_t i = 0; i < n; i += 16) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
#endif
}

// One (segment, head): keys and values of rows seg.start.. into kb [padded / 16, dk / 2, 16, 2] and
// vb [padded / 2, dim, 2] (padding stays zero).
void PackKeysValues(const float* qkv, int64_t width, int64_t heads, int64_t dim, int64_t dk, const Segment& seg,
                    int64_t head, uint16_t* kb, uint16_t* vb) {
  std::vector<uint16_t> row(dim);
  for (int64_t t = 0; t < seg.length; ++t) {
    const float* x = qkv + (seg.start + t) * width;
    if (t + kAheadRows < seg.length) {
      PrefetchFloats(x + kAheadRows * width + (heads + head) * dim, dim);
      PrefetchFloats(x + kAheadRows * width + (2 * heads + head) * dim, dim);
    }
    RoundRow(x + (heads + head) * dim, dim, row.data());
    uint16_t* k = kb + (t / 16) * dk * 16 + (t % 16) * 2;  // group t / 16, key t % 16, pair 0
    for (int64_t d = 0; d < dim; d += 2) std::memcpy(k + d * 16, row.data() + d, 4);  // pair d / 2
    RoundRow(x + (2 * heads + head) * dim, dim, row.data());
    uint16_t* v = vb + (t / 2) * dim * 2 + t % 2;
    for (int64_t d = 0; d < dim; ++d) v[2 * d] = row[d];
  }
}

// Per-thread buffers of an item.
struct Scratch {
  std::vector<uint16_t> qb_raw, p_raw;
  std::vector<float> s, o, m, l;
  uint16_t *qb, *p;  // 64-byte aligned: q [32, dk], P [32, kBlock]
  void Reserve(int64_t dim, int64_t dk) {
    qb_raw.assign(kRows * dk + 32, 0);
    p_raw.assign(kRows * kBlock + 32, 0);
    qb = fd_cpu::Align64(qb_raw.data());
    p = fd_cpu::Align64(p_raw.data());
    s.resize(kRows * kBlock);
    o.resize(kRows * dim);
    m.resize(kRows);
    l.resize(kRows);
  }
};

// ---- portable products -----------------------------------------------------------------------------
// s [32, kBlock] = q [32, dk] . keys kb group g0.. (keys count, a multiple of 32)
void PortableScores(const uint16_t* qb, int64_t dim, int64_t dk, const uint16_t* kb, int64_t keys, float* s) {
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t k = 0; k < keys; ++k) {
      const uint16_t* key = kb + (k / 16) * dk * 16 + (k % 16) * 2;
      float sum = 0.f;
      for (int64_t d = 0; d < dim; ++d) sum += Bf16ToFloat(qb[r * dk + d]) * Bf16ToFloat(key[(d / 2) * 32 + d % 2]);
      s[r * kBlock + k] = sum;
    }
}

// o [32, dim] += p [32, kBlock] . vb pairs (keys count)
void PortableValues(const uint16_t* p, const uint16_t* vb, int64_t keys, int64_t dim, float* o) {
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t d = 0; d < dim; ++d) {
      float sum = o[r * dim + d];
      for (int64_t k = 0; k < keys; ++k)
        sum += Bf16ToFloat(p[r * kBlock + k]) * Bf16ToFloat(vb[((k / 2) * dim + d) * 2 + k % 2]);
      o[r * dim + d] = sum;
    }
}

// ---- AVX512-BF16 products ----------------------------------------------------------------------------
#ifdef __AVX512BF16__
inline __m512bh Pairs(const uint16_t* x) {  // 32 bf16 values (16 pairs)
  __m512bh v;
  std::memcpy(&v, x, 64);
  return v;
}

inline __m512bh SplatPair(const uint16_t* x) {  // one pair in every lane
  uint32_t pair;
  std::memcpy(&pair, x, 4);
  const __m512i v = _mm512_set1_epi32(static_cast<int>(pair));
  __m512bh h;
  std::memcpy(&h, &v, 64);
  return h;
}

void RegisterScores(const uint16_t* qb, int64_t dim, int64_t dk, const uint16_t* kb, int64_t keys, float* s) {
  constexpr int kR = 8;  // rows per tile; 2 groups of 16 keys
  for (int64_t g = 0; g < keys / 16; g += 2)
    for (int64_t r0 = 0; r0 < kRows; r0 += kR) {
      __m512 acc[kR][2];
      for (int i = 0; i < kR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
      const uint16_t* k0 = kb + g * dk * 16;
      for (int64_t pair = 0; pair < dim / 2; ++pair) {
        const __m512bh a = Pairs(k0 + pair * 32), b = Pairs(k0 + dk * 16 + pair * 32);
        for (int i = 0; i < kR; ++i) {
          const __m512bh q = SplatPair(qb + (r0 + i) * dk + 2 * pair);
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, q);
          acc[i][1] = _mm512_dpbf16_ps(acc[i][1], b, q);
        }
      }
      for (int i = 0; i < kR; ++i) {
        _mm512_storeu_ps(s + (r0 + i) * kBlock + 16 * g, acc[i][0]);
        _mm512_storeu_ps(s + (r0 + i) * kBlock + 16 * g + 16, acc[i][1]);
      }
    }
}

template <int ND>  // o [4 rows, 16 ND dims from o] += p . vb
void ValueTile(const uint16_t* p, const uint16_t* vb, int64_t keys, int64_t dim, float* o) {
  __m512 acc[4][ND];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < ND; ++j) acc[i][j] = _mm512_loadu_ps(o + i * dim + 16 * j);
  for (int64_t pair = 0; pair < keys / 2; ++pair) {
    __m512bh v[ND];
    for (int j = 0; j < ND; ++j) v[j] = Pairs(vb + (pair * dim + 16 * j) * 2);
    for (int i = 0; i < 4; ++i) {
      const __m512bh pp = SplatPair(p + i * kBlock + 2 * pair);
      for (int j = 0; j < ND; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], v[j], pp);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < ND; ++j) _mm512_storeu_ps(o + i * dim + 16 * j, acc[i][j]);
}

void RegisterValues(const uint16_t* p, const uint16_t* vb, int64_t keys, int64_t dim, float* o) {
  for (int64_t r = 0; r < kRows; r += 4)
    for (int64_t d = 0; d < dim; d += 64) {
      const uint16_t* p_r = p + r * kBlock;
      const uint16_t* v_d = vb + 2 * d;
      float* o_rd = o + r * dim + d;
      switch (std::min<int64_t>(4, (dim - d) / 16)) {
        case 4: ValueTile<4>(p_r, v_d, keys, dim, o_rd); break;
        case 3: ValueTile<3>(p_r, v_d, keys, dim, o_rd); break;
        case 2: ValueTile<2>(p_r, v_d, keys, dim, o_rd); break;
        default: ValueTile<1>(p_r, v_d, keys, dim, o_rd); break;
      }
    }
}
#endif

// ---- AMX products ------------------------------------------------------------------------------------
#ifdef FD_AMX
// Tiles: 0-3 accumulators, 4-5 A (16 rows x 32 bf16), 6-7 B (16 pairs x 16 columns).
void AmxScores(const uint16_t* qb, int64_t dk, const uint16_t* kb, int64_t keys, float* s) {
  for (int64_t g = 0; g < keys / 16; g += 2) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    const uint16_t* k0 = kb + g * dk * 16;
    for (int64_t step = 0; step < dk / 32; ++step) {
      _tile_loadd(4, qb + 32 * step, dk * 2);
      _tile_loadd(5, qb + 16 * dk + 32 * step, dk * 2);
      _tile_loadd(6, k0 + step * 16 * 32, 64);
      _tile_loadd(7, k0 + dk * 16 + step * 16 * 32, 64);
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    float* c = s + 16 * g;
    _tile_stored(0, c, kBlock * 4); _tile_stored(1, c + 16, kBlock * 4);
    _tile_stored(2, c + 16 * kBlock, kBlock * 4); _tile_stored(3, c + 16 * kBlock + 16, kBlock * 4);
  }
}

void AmxValues(const uint16_t* p, const uint16_t* vb, int64_t keys, int64_t dim, float* o) {
  const int64_t ldo = dim * 4, ldv = dim * 4;  // bytes per O row, per V pair row
  for (int64_t d = 0; d < dim; d += 32) {
    const bool two = d + 32 <= dim;  // else one 16-dim column of tiles
    float* c = o + d;
    _tile_loadd(0, c, ldo); _tile_loadd(2, c + 16 * dim, ldo);
    if (two) { _tile_loadd(1, c + 16, ldo); _tile_loadd(3, c + 16 * dim + 16, ldo); }
    for (int64_t step = 0; step < keys / 32; ++step) {
      const uint16_t* v = vb + (step * 16 * dim + d) * 2;
      _tile_loadd(4, p + 32 * step, kBlock * 2);
      _tile_loadd(5, p + 16 * kBlock + 32 * step, kBlock * 2);
      _tile_loadd(6, v, ldv);
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(2, 5, 6);
      if (two) {
        _tile_loadd(7, v + 32, ldv);
        _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, c, ldo); _tile_stored(2, c + 16 * dim, ldo);
    if (two) { _tile_stored(1, c + 16, ldo); _tile_stored(3, c + 16 * dim + 16, ldo); }
  }
}
#endif

// Online-softmax step over s [32, kBlock] (raw q.k; keys valid of padded are real): scaled, the running
// max m and sum l updated, P = bf16(exp(scale s - max)) (0 for padding keys), o rows rescaled by exp(old
// max - new max). Two vectors of keys per loop turn: two independent max and sum chains per row.
void SoftmaxStep(float* s, int64_t valid, int64_t padded, float scale, int64_t dim, Scratch& w) {
  using namespace fd_attention;
  const Vec sc = Splat(scale);
  float old_max[kRows];
  for (int64_t r = 0; r < kRows; ++r) {  // new running maxima
    float* row = s + r * kBlock;
    std::fill(row + valid, row + padded, kNoMax);
    Vec top0 = Splat(w.m[r]), top1 = top0;
    for (int64_t k = 0; k < padded; k += 2 * kLanes) {  // padded: a multiple of 32
      top0 = Max(top0, Mul(Load(row + k), sc));
      top1 = Max(top1, Mul(Load(row + k + kLanes), sc));
    }
    old_max[r] = w.m[r];
    w.m[r] = ReduceMax(Max(top0, top1));
  }
  float alpha[kRows];
  for (int64_t r = 0; r < kRows; r += kLanes)  // exp(old max - new max): 0 at the first step
    Store(alpha + r, ExpOf(Sub(Load(old_max + r), Load(w.m.data() + r))));
  for (int64_t r = 0; r < kRows; ++r) {
    const float* row = s + r * kBlock;
    uint16_t* p = w.p + r * kBlock;
    const Vec neg = Splat(-w.m[r]);
    Vec sum0 = Splat(0.f), sum1 = sum0;
    for (int64_t k = 0; k < padded; k += 2 * kLanes) {
      const Vec e0 = ExpOf(Fma(Load(row + k), sc, neg)), e1 = ExpOf(Fma(Load(row + k + kLanes), sc, neg));
      sum0 = Add(sum0, e0);
      sum1 = Add(sum1, e1);
      StoreBf16(p + k, e0);
      StoreBf16(p + k + kLanes, e1);
    }
    std::fill(p + valid, p + padded, 0);  // exactly 0, whatever exp gave
    w.l[r] = w.l[r] * alpha[r] + ReduceAdd(Add(sum0, sum1));
    const Vec a = Splat(alpha[r]);
    float* o = w.o.data() + r * dim;
    for (int64_t d = 0; d < dim; d += kLanes) Store(o + d, Mul(Load(o + d), a));
  }
}

// One item: its 32 queries over all keys of its segment. kb, vb: the (segment, head)'s buffers.
void AttendItem(const float* qkv, int64_t width, int64_t dim, int64_t dk, float scale, const Segment& seg,
                const Item& item, const uint16_t* kb, const uint16_t* vb, int kernel, float* out, int64_t out_width,
                Scratch& w) {
  std::fill(w.qb, w.qb + kRows * dk, 0);
  for (int64_t r = 0; r < item.count; ++r)
    RoundRow(qkv + (item.first + r) * width + item.head * dim, dim, w.qb + r * dk);
  std::fill(w.o.begin(), w.o.end(), 0.f);
  std::fill(w.m.begin(), w.m.end(), kNoMax);
  std::fill(w.l.begin(), w.l.end(), 0.f);
  for (int64_t start = 0; start < seg.length; start += kBlock) {
    const int64_t valid = std::min(kBlock, seg.length - start);
    const int64_t padded = (valid + kKeyPad - 1) / kKeyPad * kKeyPad;
    const uint16_t* k = kb + start * dk;   // group start / 16
    const uint16_t* v = vb + start * dim;  // pair start / 2
    if (kernel == kBest) {
#ifdef FD_AMX
      AmxScores(w.qb, dk, k, padded, w.s.data());
#endif
    } else if (kernel == kNoAmx) {
#ifdef __AVX512BF16__
      RegisterScores(w.qb, dim, dk, k, padded, w.s.data());
#endif
    } else {
      PortableScores(w.qb, dim, dk, k, padded, w.s.data());
    }
    SoftmaxStep(w.s.data(), valid, padded, scale, dim, w);
    if (kernel == kBest) {
#ifdef FD_AMX
      AmxValues(w.p, v, padded, dim, w.o.data());
#endif
    } else if (kernel == kNoAmx) {
#ifdef __AVX512BF16__
      RegisterValues(w.p, v, padded, dim, w.o.data());
#endif
    } else {
      PortableValues(w.p, v, padded, dim, w.o.data());
    }
  }
  for (int64_t r = 0; r < item.count; ++r) {
    float* dst = out + (item.first + r) * out_width + item.head * dim;
    const float inv = 1.f / w.l[r];
    for (int64_t d = 0; d < dim; ++d) dst[d] = w.o[r * dim + d] * inv;
  }
}

// The kernel that runs for the requested one: AMX only where compiled and granted, register tiles only
// where AVX512-BF16 is compiled, else portable.
int ResolveKernel(int64_t requested) {
#ifdef FD_AMX
  if (requested == kBest && fd_amx::AmxPermitted()) return kBest;
#endif
#ifdef __AVX512BF16__
  if (requested != kPortable) return kNoAmx;
#endif
  return kPortable;
}

}  // namespace
}  // namespace fd_vision_bf16

std::vector<paddle::Tensor> VisionAttentionBf16(const paddle::Tensor& qkv, const paddle::Tensor& cu_seqlens,
                                                int num_heads, float scale, int64_t kernel) {
  using namespace fd_vision_bf16;
  PD_CHECK(qkv.dtype() == paddle::DataType::FLOAT32 && qkv.shape().size() == 2, "vision_attention_bf16: qkv must "
           "be a 2-D float32 tensor");
  PD_CHECK(cu_seqlens.dtype() == paddle::DataType::INT64 && cu_seqlens.shape().size() == 1 && cu_seqlens.numel() >= 2,
           "vision_attention_bf16: cu_seqlens must be a 1-D int64 tensor of at least 2 entries");
  PD_CHECK(kernel >= kBest && kernel <= kPortable, "vision_attention_bf16: kernel must be 0 (best), 1 (no AMX) or "
           "2 (portable), got ", kernel);
  const int64_t n = qkv.shape()[0], width = qkv.shape()[1], heads = num_heads;
  PD_CHECK(heads > 0 && width > 0 && width % (3 * heads) == 0, "vision_attention_bf16: qkv width ", width,
           " is not 3 x ", heads, " heads x head_dim");
  const int64_t dim = width / (3 * heads), segments = cu_seqlens.numel() - 1;
  PD_CHECK(dim % 16 == 0, "vision_attention_bf16: head_dim ", dim, " must be a multiple of 16");
  const int64_t dk = (dim + 31) / 32 * 32;  // the contraction of S, zero padded
  const int64_t* cu = cu_seqlens.data<int64_t>();
  PD_CHECK(cu[0] == 0 && cu[segments] == n, "vision_attention_bf16: cu_seqlens must run from 0 to the ", n, " rows");
  std::vector<Segment> segs;
  int64_t keys = 0;
  for (int64_t f = 0; f < segments; ++f) {
    PD_CHECK(cu[f + 1] > cu[f], "vision_attention_bf16: segment ", f, " is empty");
    const int64_t length = cu[f + 1] - cu[f], padded = (length + kKeyPad - 1) / kKeyPad * kKeyPad;
    segs.push_back({cu[f], length, padded, keys});
    keys += padded;
  }
  const float* x = qkv.data<float>();
  auto out = paddle::empty({n, heads * dim}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  float* y = out.data<float>();
  const int run = ResolveKernel(kernel);
  int64_t fmas = 0;  // both products: 2 * length^2 * dim per segment and head
  for (const Segment& s : segs) fmas += 2 * s.length * s.length * dim * heads;
  const bool parallel = fmas > fd_attention::kParallelFmas;
  // (segment f, head h) buffers at key offset segs[f].offset * heads + h * segs[f].padded, zero padded
  std::vector<uint16_t> kb(keys * heads * dk, 0), vb(keys * heads * dim, 0);
  auto base = [&](int64_t f, int64_t h) { return segs[f].offset * heads + h * segs[f].padded; };
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < segments * heads; ++i) {
    const int64_t f = i / heads, h = i % heads;
    PackKeysValues(x, width, heads, dim, dk, segs[f], h, kb.data() + base(f, h) * dk, vb.data() + base(f, h) * dim);
  }
  std::vector<Item> items;
  for (int64_t f = 0; f < segments; ++f)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t first = cu[f]; first < cu[f + 1]; first += kRows)
        items.push_back({f, h, first, std::min(kRows, cu[f + 1] - first)});
  const int64_t count = static_cast<int64_t>(items.size());
  // handed out by an atomic counter, as append_attention's (custom_ops/README.md, "OpenMP runtime")
  std::atomic<int64_t> next{0};
#pragma omp parallel if (parallel)
  {
#ifdef FD_AMX
    if (run == kBest) fd_amx::ConfigureTiles();
#endif
    Scratch w;
    w.Reserve(dim, dk);
    for (int64_t i = next++; i < count; i = next++) {
      const Item& item = items[i];
      const int64_t b = base(item.segment, item.head);
      AttendItem(x, width, dim, dk, scale, segs[item.segment], item, kb.data() + b * dk, vb.data() + b * dim, run, y,
                 heads * dim, w);
    }
  }
  return {out};
}

std::vector<std::vector<int64_t>> VisionAttentionBf16InferShape(const std::vector<int64_t>& qkv,
                                                                const std::vector<int64_t>&, int, float, int64_t) {
  return {{qkv[0], qkv[1] / 3}};
}

std::vector<paddle::DataType> VisionAttentionBf16InferDtype(const paddle::DataType& qkv, const paddle::DataType&) {
  return {qkv};
}

PD_BUILD_OP(vision_attention_bf16)
    .Inputs({"QKV", "CuSeqlens"})
    .Outputs({"Out"})
    .Attrs({"num_heads: int", "scale: float", "kernel: int64_t"})
    .SetKernelFn(PD_KERNEL(VisionAttentionBf16))
    .SetInferShapeFn(PD_INFER_SHAPE(VisionAttentionBf16InferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(VisionAttentionBf16InferDtype));
