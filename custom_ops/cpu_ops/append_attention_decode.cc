// append_attention's decode item (a request with one new token this step): the `group` query heads
// of one KV head score every cached key, one exact softmax per head, then P.V over the value rows; the
// K and V rows are prefetched a few lines at a time between the products' steps (RowPrefetcher).
//
// Two kernels, the same float32 arithmetic up to the order of the sums:
//   * float32 FMAs: scores 16 keys per transposing reduction, P.V as register tiles; a bf16 cache's
//     rows widened to float32 once per 16-row slice.
//   * AMX-BF16 (a bf16 cache, head_dim a multiple of 32, group <= 16; DecodeAmx): the tiles multiply
//     bf16 pairs, so each float32 operand that is not bf16 already, the scaled query and the
//     probabilities, goes in as three bf16 parts (hi + mid + lo: 8 + 8 + 8 significant bits, exactly
//     the float32 value), each part's products exact in float32: S^T = K Q^T with 16 cache rows as
//     they are for the A tile, the exact softmax down the keys (heads in the lanes), then P.V from the
//     probabilities' and the value rows' key pairs.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "amx_tiles.h"
#include "append_attention_common.h"

namespace fd_attention {
namespace {

using fd_cpu::Align64;  // amx_tiles.h

// q [group, dim] = the item's query heads times the scale.
template <typename Cache>
void ScaledQuery(const Inputs<Cache>& in, const Geometry& g, const Item& item, float* q) {
  const float* q_in = QueryRow(in, g, in.cu_seqlens[item.request], item.kv_head * g.group);
  for (int64_t i = 0; i < g.group * g.head_dim; ++i) q[i] = q_in[i] * g.scale;
}

// The item's output rows = o[h] / sums[h] (o [>= group, dim]).
template <typename Cache>
void StoreOutput(const Inputs<Cache>& in, const Geometry& g, const Item& item, const float* o, const float* sums) {
  const int64_t dim = g.head_dim;
  float* out = in.out + in.cu_seqlens[item.request] * g.num_heads * dim + item.kv_head * g.group * dim;
  for (int64_t h = 0; h < g.group; ++h) {
    const float inv = 1.f / sums[h];
    for (int64_t d = 0; d < dim; ++d) out[h * dim + d] = o[h * dim + d] * inv;
  }
}

// Software prefetch for one decode item, spread over its work: the kernels call Ahead every few
// multiply-adds, each time for a few cache lines. (One burst of a 16-row slice's lines fills the line
// fill buffers and stalls the core until they drain.) It walks the rows in the order the item reads
// them, the K rows of every block in context order, then the V rows, up to kPrefetchRows rows past the
// slice being read: on across block boundaries, and from the last K rows into the first V rows.
template <typename Cache>
class RowPrefetcher {
 public:
  RowPrefetcher(const Inputs<Cache>& in, const Geometry& g, const int64_t* blocks, int64_t kv_head, int64_t context)
      : in_(in), g_(g), blocks_(blocks), kv_head_(kv_head), context_(context),
        row_bytes_(g.head_dim * static_cast<int64_t>(sizeof(Cache))) {
    StartRun();
  }

  // Up to `lines` more cache lines, none past row `row` + kPrefetchRows (rows: K 0 .. context - 1, then
  // V as rows context .. 2 context - 1).
  void Ahead(int64_t row, int64_t lines) {
    const int64_t end = std::min(2 * context_, row + kPrefetchRows);
    while (lines > 0) {
      if (line_ >= run_end_ && (first_ + rows_ >= end || !NextRun())) return;
      const char* limit = start_ + (std::min(end, first_ + rows_) - first_) * row_bytes_;
      if (line_ >= limit) return;
      for (; lines > 0 && line_ < limit; --lines, line_ += 64) __builtin_prefetch(line_, 0, 3);
    }
  }

  // Lines per call for `calls` calls to issue 32 rows' lines: twice what a 16-row slice reads, so that
  // the cursor gets ahead and stays there.
  int64_t LinesPerCall(int64_t calls) const { return std::max<int64_t>(1, (2 * kLanes * row_bytes_) / (64 * calls)); }

 private:
  void StartRun() {  // block block_'s rows (K or V) that the context covers: one contiguous run
    rows_ = std::min(g_.block_size, context_ - block_ * g_.block_size);
    start_ = line_ = reinterpret_cast<const char*>(
        BlockRows(values_ ? in_.value_cache : in_.key_cache, g_, blocks_[block_], kv_head_));
    run_end_ = start_ + rows_ * row_bytes_;
  }
  bool NextRun() {  // false past the last V block
    first_ += rows_;
    if (++block_ * g_.block_size >= context_) {
      if (values_) return false;
      values_ = true;
      block_ = 0;
    }
    StartRun();
    return true;
  }

  const Inputs<Cache>& in_;
  const Geometry& g_;
  const int64_t* blocks_;
  const int64_t kv_head_, context_, row_bytes_;
  int64_t block_ = 0, first_ = 0, rows_ = 0;  // the run: block_ of K or V, rows first_ .. first_ + rows_ - 1
  bool values_ = false;
  const char* start_ = nullptr;
  const char* run_end_ = nullptr;
  const char* line_ = nullptr;  // the next line to prefetch
};

inline float Dot(const float* a, const float* b, int64_t n) {
  Vec acc = Splat(0.f);
  for (int64_t d = 0; d < n; d += kLanes) acc = Fma(Load(a + d), Load(b + d), acc);
  return ReduceAdd(acc);
}

// s[k] = q . keys[k] for 16 consecutive key rows (independent FMA chains, one transposing reduction);
// hint() once per 16 values of the dot products. DIM: the head dimension when known at compile time
// (then every key row is one base register plus a constant: no row pointers kept on the stack), else 0
// and dim gives it.
template <int64_t DIM, typename Hint>
inline void Dot16(const float* q, const float* keys, int64_t dim, float* s, const Hint& hint) {
  const int64_t n = DIM > 0 ? DIM : dim;
  Vec acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = Splat(0.f);
  for (int64_t d = 0; d < n; d += kLanes) {
    hint();
    const Vec qd = Load(q + d);
    for (int k = 0; k < kLanes; ++k) acc[k] = Fma(qd, Load(keys + k * n + d), acc[k]);
  }
  Store(s, SumEach(acc));
}

// s[h * stride + k] = q[h] . keys[k], heads h < group, keys k < count, of one cache block (context rows
// first .. first + count - 1) whose rows beyond `count` (up to block_size) may be read: their scores land
// in s and are never used. wide: [16, dim] scratch for the widened rows of a bf16 cache.
template <typename Cache>
void DecodeScores(const float* q, int64_t group, const Cache* keys, int64_t first, int64_t count, int64_t block_size,
                  int64_t dim, float* s, int64_t stride, float* wide, RowPrefetcher<Cache>& ahead) {
  const int64_t lines = ahead.LinesPerCall(group * dim / kLanes);
  int64_t k = 0;
  for (; k < count && k + kLanes <= block_size; k += kLanes) {
    const float* rows = AsFloats(keys + k * dim, kLanes * dim, wide);
    const auto hint = [&] { ahead.Ahead(first + k + kLanes, lines); };
    for (int64_t h = 0; h < group; ++h) {
      float* scores = s + h * stride + k;
      switch (dim) {  // the usual head dims compiled with the dim constant
        case 128: Dot16<128>(q + h * dim, rows, dim, scores, hint); break;
        case 64: Dot16<64>(q + h * dim, rows, dim, scores, hint); break;
        default: Dot16<0>(q + h * dim, rows, dim, scores, hint); break;
      }
    }
  }
  if (k == count) return;
  const int64_t tail = k;  // the block's last count - tail keys (fewer than 16), one at a time
  const float* rows = AsFloats(keys + tail * dim, (count - tail) * dim, wide);
  for (; k < count; ++k)
    for (int64_t h = 0; h < group; ++h) s[h * stride + k] = Dot(q + h * dim, rows + (k - tail) * dim, dim);
}

#ifdef FD_AMX
// ---- AMX-BF16 (all tiles 16 rows x 64 bytes: amx_tiles.h ConfigureTiles) ------------------------------
// Scores as S^T = K . Q^T: the A tile is 16 key rows of the cache as they are (32 dims each step), the
// B tiles the query's three parts as pairs qT [3][dim / 2, 16 heads, 2], the accumulator [16 keys, 16
// heads]. The softmax then runs down the keys with the heads in the lanes. For P.V the A tiles are the
// probabilities' three parts as P^T [3][16 heads, 16 key pairs, 2] per 32 keys (the key pairs interleaved,
// then transposed 16 x 16), the B tile the value rows' key pairs vb [pairs, dim, 2], the accumulators
// O [16 heads, 16 dims].
constexpr int64_t kAmxHeads = 16;  // query heads of one KV head the AMX path takes (a tile's rows / columns)
constexpr int kParts = 3;          // bf16 parts of a float32 value: 3 x 8 significant bits

// x = hi + mid + lo exactly (each bf16, nearest even; a float32 significand has 24 bits), but for a
// remainder below float32's normal range (under 2^-126), which the conversion flushes to zero.
inline void SplitBf16(Vec x, Vec parts[kParts]) {
  for (int i = 0; i < kParts; ++i) {
    const __m256bh h = _mm512_cvtneps_pbh(x);
    parts[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(h)), 16));
    x = Sub(x, parts[i]);
  }
}

// The 16-bit permutation index that interleaves a[first + i] and b[first + i] into pair i, i < 16: for
// _mm512_permutex2var_epi16 on two rows a, b of 32 (second = 32), or for _mm512_permutexvar_epi16 on
// one register holding a in lanes 0-15 and b in 16-31 (first = 0, second = 16).
inline __m512i PairIndex(int first, int second) {
  alignas(64) uint16_t index[32];
  for (int i = 0; i < 16; ++i) {
    index[2 * i] = static_cast<uint16_t>(first + i);
    index[2 * i + 1] = static_cast<uint16_t>(second + first + i);
  }
  return _mm512_load_si512(index);
}

// r[j][i] = r[i][j] for a 16 x 16 matrix of 32-bit elements, one row per register.
inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // u[4 k + m], 128-bit lane L: rows 4 k .. 4 k + 3 of column 4 L + m
    u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
    r[m] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[4 + m] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    r[8 + m] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

// Two float32 vectors of bf16 values as 16 bf16 pairs (a[i], b[i]); index: PairIndex(0, 16).
inline __m512i PairUp(Vec a, Vec b, __m512i index) {
  const __m512bh both = _mm512_cvtne2ps_pbh(b, a);  // lanes 0-15 a, 16-31 b (exact: bf16 values)
  return _mm512_permutexvar_epi16(index, reinterpret_cast<const __m512i&>(both));
}

// Two float32 vectors of bf16 values as 32 consecutive bf16 (a's 16, then b's).
inline __m512i Concat(Vec a, Vec b) {
  const __m512bh both = _mm512_cvtne2ps_pbh(b, a);
  return reinterpret_cast<const __m512i&>(both);
}

// qT[part][(p * 16 + h) * 2 + i] = that part of q[h][2 p + i]; heads past `group` zero. q: [group, dim]
// scaled. Per 32 dims, each head's 16 pairs of a part are one register: 16 heads transposed 16 x 16.
void PackQueryPairs(const float* q, int64_t group, int64_t dim, Bf16* qT) {
  const Vec zero = Splat(0.f);
  for (int64_t d = 0; d < dim; d += 2 * kLanes) {  // pairs d / 2 .. d / 2 + 15
    __m512i r[kParts][16];
    for (int64_t h = 0; h < 16; ++h) {
      Vec a[kParts], b[kParts];
      SplitBf16(h < group ? Load(q + h * dim + d) : zero, a);
      SplitBf16(h < group ? Load(q + h * dim + d + kLanes) : zero, b);
      for (int j = 0; j < kParts; ++j) r[j][h] = Concat(a[j], b[j]);
    }
    for (int j = 0; j < kParts; ++j) {
      Transpose16x16(r[j]);
      for (int64_t p = 0; p < 16; ++p) _mm512_storeu_si512(qT + j * dim * kAmxHeads + (d / 2 + p) * 32, r[j][p]);
    }
  }
}

// Rows k .. k + 15 of a block of block_size rows at `keys`: in place, or, when they would run past the
// block, copied into `staging` [16, dim] with zero rows after the block's (rows past the context but
// inside the block are read as they are: their scores are never used).
inline const Bf16* KeyTileRows(const Bf16* keys, int64_t k, int64_t block_size, int64_t dim, Bf16* staging) {
  if (k + 16 <= block_size) return keys + k * dim;
  std::memcpy(staging, keys + k * dim, (block_size - k) * dim * sizeof(Bf16));
  std::fill(staging + (block_size - k) * dim, staging + 16 * dim, Bf16{0});
  return staging;
}

// sT[t][h] = q[h] . keys[t] for the keys of one block (count of block_size rows at `keys`), 32 at a time
// as two accumulator tiles (two dependency chains sharing each query tile); staging: [32, dim]. hint(k)
// once per 32 dims of keys k .. k + 31.
template <typename Hint>
void AmxBlockScores(const Bf16* qT, const Bf16* keys, int64_t count, int64_t block_size, int64_t dim,
                    Bf16* staging, float* sT, const Hint& hint) {
  const int64_t part = dim * kAmxHeads, ld = dim * sizeof(Bf16);  // one part of qT; a key row
  for (int64_t k = 0; k < count; k += 32) {
    const Bf16* rows0 = KeyTileRows(keys, k, block_size, dim, staging);
    if (k + 16 >= count) {  // one tile of keys left
      _tile_zero(0);
      for (int64_t d = 0; d < dim; d += 2 * kLanes) {
        hint(k);
        _tile_loadd(1, rows0 + d, ld);
        _tile_loadd(2, qT + d * kAmxHeads, 64);  // pairs d / 2 .. d / 2 + 15 of each part
        _tile_loadd(3, qT + part + d * kAmxHeads, 64);
        _tile_loadd(4, qT + 2 * part + d * kAmxHeads, 64);
        _tile_dpbf16ps(0, 1, 2);
        _tile_dpbf16ps(0, 1, 3);
        _tile_dpbf16ps(0, 1, 4);
      }
      _tile_stored(0, sT + k * kAmxHeads, 64);
      continue;
    }
    const Bf16* rows1 = KeyTileRows(keys, k + 16, block_size, dim, staging + 16 * dim);
    _tile_zero(0);
    _tile_zero(6);
    for (int64_t d = 0; d < dim; d += 2 * kLanes) {
      hint(k);
      _tile_loadd(1, rows0 + d, ld);
      _tile_loadd(5, rows1 + d, ld);
      _tile_loadd(2, qT + d * kAmxHeads, 64);
      _tile_loadd(3, qT + part + d * kAmxHeads, 64);
      _tile_loadd(4, qT + 2 * part + d * kAmxHeads, 64);
      _tile_dpbf16ps(0, 1, 2);
      _tile_dpbf16ps(6, 5, 2);
      _tile_dpbf16ps(0, 1, 3);
      _tile_dpbf16ps(6, 5, 3);
      _tile_dpbf16ps(0, 1, 4);
      _tile_dpbf16ps(6, 5, 4);
    }
    _tile_stored(0, sT + k * kAmxHeads, 64);
    _tile_stored(6, sT + (k + 16) * kAmxHeads, 64);
  }
}

// pT [chunks][3 parts][16 heads, 16 pairs, 2]: chunk c holds keys 32 c .. 32 c + 31, head h's parts of
// (p[2 i], p[2 i + 1]); keys past the context zero. sT: [.., 16] probabilities, rows < context.
void PackProbabilityPairs(const float* sT, int64_t context, int64_t chunks, Bf16* pT) {
  const Vec zero = Splat(0.f);
  const __m512i pairs = PairIndex(0, 16);
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i r[kParts][16];
    for (int64_t i = 0; i < 16; ++i) {  // row i: key pair i of the chunk, lane h its two probabilities
      const int64_t t = 32 * c + 2 * i;
      Vec a[kParts], b[kParts];
      SplitBf16(t < context ? Load(sT + t * kAmxHeads) : zero, a);
      SplitBf16(t + 1 < context ? Load(sT + (t + 1) * kAmxHeads) : zero, b);
      for (int j = 0; j < kParts; ++j) r[j][i] = PairUp(a[j], b[j], pairs);
    }
    for (int j = 0; j < kParts; ++j) {
      Transpose16x16(r[j]);
      for (int64_t h = 0; h < 16; ++h) _mm512_storeu_si512(pT + ((c * kParts + j) * 16 + h) * 32, r[j][h]);
    }
  }
}

// vb [pairs, dim, 2]: pair i's values (v[2 i][d], v[2 i + 1][d]) for the `pairs` pairs from context
// position 0 (zero past the context). hint(t) once per pair of keys t, t + 1.
template <typename Hint>
void PackValuePairs(const Inputs<Bf16>& in, const Geometry& g, const int64_t* blocks, int64_t kv_head,
                    int64_t context, int64_t pairs, const Bf16* zero_row, Bf16* vb, const Hint& hint) {
  const int64_t dim = g.head_dim;
  const __m512i lo = PairIndex(0, 32), hi = PairIndex(16, 32);
  for (int64_t i = 0; i < pairs; ++i) {
    Bf16* out = vb + i * dim * 2;
    const int64_t t = 2 * i;  // block_size is even: t and t + 1 share a block
    if (t >= context) {
      std::fill(out, out + dim * 2, Bf16{0});
      continue;
    }
    hint(t);
    const Bf16* r0 = BlockRows(in.value_cache, g, blocks[t / g.block_size], kv_head) + (t % g.block_size) * dim;
    const Bf16* r1 = t + 1 < context ? r0 + dim : zero_row;  // a bf16 NaN past the context would survive p = 0
    for (int64_t d = 0; d < dim; d += 2 * kLanes) {
      const __m512i a = _mm512_loadu_si512(r0 + d), b = _mm512_loadu_si512(r1 + d);
      _mm512_storeu_si512(out + 2 * d, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(out + 2 * d + 2 * kLanes, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// o [16, dim] columns d0 .. d0 + 16 N - 1 = P . V over `chunks` chunks of 32 keys: N accumulator tiles,
// the three parts of P in turn; hint() once per chunk.
template <int N, typename Hint>
void AmxValueTiles(const Bf16* pT, const Bf16* vb, int64_t chunks, int64_t dim, int64_t d0, float* o,
                   const Hint& hint) {
  static_assert(N == 2 || N == 4, "two or four 16-dim tiles");
  _tile_zero(0);
  _tile_zero(1);
  if (N > 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t stride = dim * 2 * sizeof(Bf16);  // a pair row of vb
  for (int64_t c = 0; c < chunks; ++c) {
    hint();
    const Bf16* p = pT + c * kParts * 16 * 32;
    const Bf16* b = vb + (c * 16 * dim + d0) * 2;
    _tile_loadd(4, p, 64);
    _tile_loadd(5, p + 16 * 32, 64);
    _tile_loadd(6, p + 2 * 16 * 32, 64);
    for (int j = 0; j < N; ++j) {
      _tile_loadd(7, b + j * 2 * kLanes, stride);
      switch (j) {  // tile numbers are immediates
        case 0: _tile_dpbf16ps(0, 4, 7); _tile_dpbf16ps(0, 5, 7); _tile_dpbf16ps(0, 6, 7); break;
        case 1: _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(1, 5, 7); _tile_dpbf16ps(1, 6, 7); break;
        case 2: _tile_dpbf16ps(2, 4, 7); _tile_dpbf16ps(2, 5, 7); _tile_dpbf16ps(2, 6, 7); break;
        default: _tile_dpbf16ps(3, 4, 7); _tile_dpbf16ps(3, 5, 7); _tile_dpbf16ps(3, 6, 7); break;
      }
    }
  }
  const int64_t ldo = dim * sizeof(float);
  _tile_stored(0, o + d0, ldo);
  _tile_stored(1, o + d0 + kLanes, ldo);
  if (N > 2) {
    _tile_stored(2, o + d0 + 2 * kLanes, ldo);
    _tile_stored(3, o + d0 + 3 * kLanes, ldo);
  }
}

// DecodeItem's AMX path (bf16 cache, head_dim a multiple of 32, group <= 16): out[h] for the item; while
// its P.V tiles run, the first K rows of `following` (this thread's next item, if a decode) are prefetched.
void DecodeAmx(const Inputs<Bf16>& in, const Geometry& g, const Item& item, const Item* following,
               Scratch& scratch) {
  const int64_t dim = g.head_dim, group = g.group;
  const int64_t context = in.history[item.request] + 1;
  const int64_t* blocks = in.block_tables + item.request * g.max_blocks;
  const int64_t chunks = (context + 31) / 32, rows = chunks * 32;  // keys padded to whole 32-key chunks
  if (!scratch.tiles) {
    fd_amx::ConfigureTiles();
    scratch.tiles = true;
  }
  scratch.floats.resize(rows * kAmxHeads + kAmxHeads * dim + group * dim + 16);
  float* sT = Align64(scratch.floats.data());  // [rows, 16] scores, then probabilities
  float* o = sT + rows * kAmxHeads;             // [16, dim]
  float* q = o + kAmxHeads * dim;               // [group, dim] scaled
  const int64_t halves = kParts * dim * kAmxHeads + chunks * kParts * 16 * 32 + rows * dim + 33 * dim + 32;
  Bf16* qT = Align64(scratch.Halves(halves));  // [3][dim / 2, 16, 2]
  Bf16* pT = qT + kParts * dim * kAmxHeads;   // [chunks][3][16, 16, 2]
  Bf16* vb = pT + chunks * kParts * 16 * 32;  // [rows / 2, dim, 2]
  Bf16* staging = vb + rows * dim;            // [32, dim]
  Bf16* zero_row = staging + 32 * dim;        // [dim]
  std::fill(zero_row, zero_row + dim, Bf16{0});
  RowPrefetcher<Bf16> ahead(in, g, blocks, item.kv_head, context);
  ahead.Ahead(0, ahead.LinesPerCall(1));  // the first 32 K rows
  ScaledQuery(in, g, item, q);
  PackQueryPairs(q, group, dim, qT);
  const int64_t score_lines = ahead.LinesPerCall(dim / (2 * kLanes)) * 2;  // per 32 keys
  for (int64_t start = 0; start < context; start += g.block_size) {
    const Bf16* k = BlockRows(in.key_cache, g, blocks[start / g.block_size], item.kv_head);
    const auto hint = [&](int64_t key) { ahead.Ahead(start + key + kLanes, score_lines); };
    AmxBlockScores(qT, k, std::min(g.block_size, context - start), g.block_size, dim, staging, sT + start * kAmxHeads,
                   hint);
  }
  // the exact softmax down the keys, the 16 heads in the lanes
  const Vec floor = Splat(kExpFloor);
  Vec top = Splat(kMasked), sum = Splat(0.f);
  for (int64_t t = 0; t < context; ++t) top = Max(top, Load(sT + t * kAmxHeads));
  for (int64_t t = 0; t < context; ++t) {
    const Vec p = ExpOf(Max(Sub(Load(sT + t * kAmxHeads), top), floor));
    Store(sT + t * kAmxHeads, p);
    sum = Add(sum, p);
  }
  alignas(64) float sums[kAmxHeads];
  Store(sums, sum);
  PackProbabilityPairs(sT, context, chunks, pT);
  const int64_t value_lines = ahead.LinesPerCall(kLanes / 2);
  PackValuePairs(in, g, blocks, item.kv_head, context, rows / 2, zero_row, vb,
                 [&](int64_t t) { ahead.Ahead(context + t + kLanes, value_lines); });
  std::optional<RowPrefetcher<Bf16>> upcoming;  // the following item's K rows, if it is a decode
  if (following != nullptr && IsDecode(in, *following))
    upcoming.emplace(in, g, in.block_tables + following->request * g.max_blocks, following->kv_head,
                     in.history[following->request] + 1);
  const int64_t upcoming_lines = ahead.LinesPerCall(chunks * ((dim + 4 * kLanes - 1) / (4 * kLanes)));
  const auto hint = [&] {
    if (upcoming) upcoming->Ahead(0, upcoming_lines);
  };
  for (int64_t d0 = 0; d0 < dim; d0 += 4 * kLanes) {
    if (dim - d0 >= 4 * kLanes) {
      AmxValueTiles<4>(pT, vb, chunks, dim, d0, o, hint);
    } else {
      AmxValueTiles<2>(pT, vb, chunks, dim, d0, o, hint);  // dim is a multiple of 32
    }
  }
  StoreOutput(in, g, item, o, sums);
}
#endif

}  // namespace

// One query token of request i, the `group` heads of KV head h: scores, exact softmax, P.V.
template <typename Cache>
void DecodeItem(const Inputs<Cache>& in, const Geometry& g, const Item& item, const Item* following,
                Scratch& scratch) {
#ifdef FD_AMX
  if constexpr (std::is_same_v<Cache, Bf16>) {
    if (g.kernel == kBest && g.head_dim % (2 * kLanes) == 0 && g.group <= kAmxHeads) {
      DecodeAmx(in, g, item, following, scratch);
      return;
    }
  }
#endif
  const int64_t dim = g.head_dim, group = g.group;
  const int64_t context = in.history[item.request] + 1;
  const int64_t* blocks = in.block_tables + item.request * g.max_blocks;
  const int64_t stride = context + kLanes;  // room for a last partial 16 (scores or padding)
  scratch.floats.resize(group * (2 * dim + stride + 1) + kLanes * dim);
  float* q = scratch.floats.data();      // [group, dim], scaled
  float* o = q + group * dim;     // [group, dim]
  float* sums = o + group * dim;  // [group]
  float* s = sums + group;        // [group, stride]
  float* wide = s + group * stride;  // [16, dim]: bf16 cache rows widened
  RowPrefetcher<Cache> ahead(in, g, blocks, item.kv_head, context);
  ahead.Ahead(0, ahead.LinesPerCall(1));  // the first 32 K rows
  ScaledQuery(in, g, item, q);
  for (int64_t start = 0; start < context; start += g.block_size) {
    const Cache* k = BlockRows(in.key_cache, g, blocks[start / g.block_size], item.kv_head);
    DecodeScores(q, group, k, start, std::min(g.block_size, context - start), g.block_size, dim, s + start, stride,
                 wide, ahead);
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
  // per key, (group rounded up to 4) / 4 x (dim / 64 rounded up) register tiles take a step each
  const int64_t lines = ahead.LinesPerCall((group + 3) / 4 * ((dim + 63) / 64) * kLanes);
  for (int64_t start = 0; start < context; start += g.block_size) {
    const Cache* v = BlockRows(in.value_cache, g, blocks[start / g.block_size], item.kv_head);
    const int64_t keys = std::min(g.block_size, context - start);
    for (int64_t k = 0; k < keys; k += kLanes) {
      const int64_t slice = std::min(kLanes, keys - k);
      const auto hint = [&] { ahead.Ahead(context + start + k + kLanes, lines); };
      AccumulateValues(s + start + k, 1, stride, group, AsFloats(v + k * dim, slice * dim, wide), slice, dim, o, hint);
    }
  }
  StoreOutput(in, g, item, o, sums);
}

template void DecodeItem(const Inputs<float>&, const Geometry&, const Item&, const Item*, Scratch&);
template void DecodeItem(const Inputs<Bf16>&, const Geometry&, const Item&, const Item*, Scratch&);

}  // namespace fd_attention
