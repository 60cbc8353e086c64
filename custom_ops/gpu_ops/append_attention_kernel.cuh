// Append attention over FastDeploy's paged KV cache for a ragged batch, CUDA (pure CUDA + CUB).
//
// One call per layer, two kernels on one stream:
//   1. WriteKvCacheKernel: this step's K and V rows (RoPE already applied) go to the cache slots
//      slot_mapping[token] = block_id * block_size + offset (a negative slot is skipped).
//   2. AppendAttentionKernel: request i owns query rows cu_seqlens_q[i] .. cu_seqlens_q[i+1] and
//      has seq_lens_decoder[i] tokens cached before this step; its query j attends keys
//      0 .. seq_lens_decoder[i] + j (causal), read in place through block_tables[i].
// Same math as the pure-Paddle reference (fastdeploy/model_executor/layers/attention.py):
// out = softmax(q k^T * scale) v per query head, GQA (query head h reads KV head h / (H / KVH)).
//
// Shapes (T = float, __half or __nv_bfloat16; the arithmetic is float32):
//   qkv            [num_tokens, (H + 2 * KVH) * D]   q heads, then k heads, then v heads
//   key/value_cache[num_blocks, KVH, block_size, D] (written in place)
//   slot_mapping   [num_tokens] int64
//   block_tables   [batch_size, max_blocks_per_seq] int32 or int64, -1 padded (never read there)
//   cu_seqlens_q   [batch_size + 1] int32; seq_lens_decoder [batch_size] int32
//   out            [num_tokens, H * D]
//
// Work split: one thread block per (query tile, KV head). A query tile is up to kRows / group
// consecutive tokens of one request times the group of query heads sharing the KV head, so K/V
// tiles loaded into shared memory serve every row of the tile. Keys are streamed in tiles of
// kKeys with an online (running max) softmax in base 2; the scores never leave the chip.
#pragma once

#include <cub/block/block_scan.cuh>

#include "gpu_common.cuh"

namespace fdgpu {

struct AppendAttentionShape {
  int num_tokens;          // rows of qkv
  int batch_size;          // requests: rows of block_tables
  int num_heads;           // query heads H
  int kv_heads;            // KV heads KVH: divides H, and H / KVH <= attention::kRows
  int head_dim;            // D: 64 or 128
  int block_size;          // tokens per cache block
  int max_blocks_per_seq;  // columns of block_tables
  float scale;             // softmax scale, usually D^-0.5
};

namespace attention {
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 32;  // (token, head) query rows per thread block
constexpr int kKeys = 32;  // keys per tile: one lane per key while scoring
constexpr int kRowsPerWarp = kRows / kWarps;
constexpr float kLog2e = 1.4426950408889634f;
}  // namespace attention

template <typename T>
__global__ void WriteKvCacheKernel(const T* __restrict__ qkv, const int64_t* __restrict__ slot_mapping,
                                   T* __restrict__ key_cache, T* __restrict__ value_cache, AppendAttentionShape s) {
  const int64_t row = static_cast<int64_t>(s.kv_heads) * s.head_dim;  // one token's K (or V)
  const int64_t total = s.num_tokens * row;
  const int64_t qkv_stride = static_cast<int64_t>(s.num_heads + 2 * s.kv_heads) * s.head_dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t token = i / row, within = i % row;
    const int64_t slot = slot_mapping[token];
    if (slot < 0) continue;
    const int64_t head = within / s.head_dim, d = within % s.head_dim;
    const int64_t block = slot / s.block_size, offset = slot % s.block_size;
    const int64_t dst = ((block * s.kv_heads + head) * s.block_size + offset) * s.head_dim + d;
    const T* k = qkv + token * qkv_stride + static_cast<int64_t>(s.num_heads) * s.head_dim + within;
    key_cache[dst] = k[0];
    value_cache[dst] = k[row];
  }
}

// Requests are cut into tiles of q_tile tokens, numbered in batch order; finds the request of tile
// `tile` and its first token (relative to the request). False past the last tile.
__device__ __forceinline__ bool FindQueryTile(const int* cu_seqlens_q, int batch_size, int q_tile, int tile,
                                              int* request, int* first) {
  using Scan = cub::BlockScan<int, attention::kThreads>;
  __shared__ typename Scan::TempStorage storage;
  __shared__ int found_request, found_first;
  if (threadIdx.x == 0) found_request = -1;
  __syncthreads();
  int carry = 0;
  for (int base = 0; base < batch_size; base += attention::kThreads) {
    const int i = base + threadIdx.x;
    const int tiles = i < batch_size ? static_cast<int>(CeilDiv(cu_seqlens_q[i + 1] - cu_seqlens_q[i], q_tile)) : 0;
    int start, chunk_tiles;
    Scan(storage).ExclusiveSum(tiles, start, chunk_tiles);
    start += carry;
    if (tile >= start && tile < start + tiles) {
      found_request = i;
      found_first = (tile - start) * q_tile;
    }
    carry += chunk_tiles;
    __syncthreads();  // found_* visible; scan storage free for the next chunk
    if (found_request >= 0) break;
  }
  *request = found_request;
  *first = found_first;
  return found_request >= 0;
}

// Tile of kKeys cached rows (keys tile .. tile + kKeys of one request and KV head) into kv_s as
// float; rows at or past num_keys are zero and never weighted.
template <typename T, typename BlockIndex, int kHeadDim>
__device__ __forceinline__ void LoadKvTile(const T* __restrict__ cache, const BlockIndex* __restrict__ blocks,
                                           int tile, int num_keys, int kv_head, const AppendAttentionShape& s,
                                           float (*kv_s)[kHeadDim + 1]) {
  for (int i = threadIdx.x; i < attention::kKeys * kHeadDim; i += attention::kThreads) {
    const int t = i / kHeadDim, d = i % kHeadDim, key = tile + t;
    float x = 0.f;
    if (key < num_keys) {
      const int64_t block = static_cast<int64_t>(blocks[key / s.block_size]);
      x = ToFloat(cache[((block * s.kv_heads + kv_head) * s.block_size + key % s.block_size) * kHeadDim + d]);
    }
    kv_s[t][d] = x;
  }
}

template <typename T, typename BlockIndex, int kHeadDim>
__global__ void __launch_bounds__(attention::kThreads)
    AppendAttentionKernel(const T* __restrict__ qkv, const T* __restrict__ key_cache,
                          const T* __restrict__ value_cache, const BlockIndex* __restrict__ block_tables,
                          const int* __restrict__ cu_seqlens_q, const int* __restrict__ seq_lens_decoder,
                          T* __restrict__ out, AppendAttentionShape s, int q_tile) {
  using namespace attention;
  static_assert(kThreads % kHeadDim == 0 || kHeadDim % kThreads == 0, "column ownership");
  constexpr int kRowGroups = kThreads / kHeadDim;  // value phase: thread owns one column of
  constexpr int kAccRows = kRows / kRowGroups;     // rows rg, rg + kRowGroups, ...
  __shared__ float q_s[kRows][kHeadDim];           // scaled by scale * log2(e): softmax in base 2
  __shared__ float kv_s[kKeys][kHeadDim + 1];      // K tile, then V tile; +1 avoids bank conflicts
  __shared__ float p_s[kRows][kKeys];              // unnormalised probabilities of the tile
  __shared__ float alpha_s[kRows];                 // rescale of each row's accumulator this tile
  __shared__ float l_s[kRows];                     // softmax denominators

  int request, first;
  if (!FindQueryTile(cu_seqlens_q, s.batch_size, q_tile, blockIdx.x, &request, &first)) return;
  const int kv_head = blockIdx.y, group = s.num_heads / s.kv_heads;
  const int q_start = cu_seqlens_q[request] + first;
  const int tokens = min(q_tile, cu_seqlens_q[request + 1] - q_start);
  const int rows = tokens * group;  // row r: token q_start + r / group, head kv_head * group + r % group
  const int history = seq_lens_decoder[request] + first;  // keys before the tile's first token
  const int num_keys = history + tokens;
  const int64_t qkv_stride = static_cast<int64_t>(s.num_heads + 2 * s.kv_heads) * kHeadDim;
  const BlockIndex* blocks = block_tables + static_cast<int64_t>(request) * s.max_blocks_per_seq;

  const float q_scale = s.scale * kLog2e;
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += kThreads) {
    const int r = i / kHeadDim, d = i % kHeadDim;
    const int64_t token = q_start + r / group, head = kv_head * group + r % group;
    q_s[r][d] = r < rows ? ToFloat(qkv[token * qkv_stride + head * kHeadDim + d]) * q_scale : 0.f;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m[kRowsPerWarp], l[kRowsPerWarp];  // running max and denominator of row warp + kWarps * k
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) m[k] = -INFINITY, l[k] = 0.f;
  const int column = threadIdx.x % kHeadDim, row_group = threadIdx.x / kHeadDim;
  float acc[kAccRows];  // out[row_group + kRowGroups * k][column], unnormalised
#pragma unroll
  for (int k = 0; k < kAccRows; ++k) acc[k] = 0.f;

  for (int tile = 0; tile < num_keys; tile += kKeys) {
    __syncthreads();  // q_s written; the previous tile's readers of kv_s and p_s are done
    LoadKvTile<T, BlockIndex, kHeadDim>(key_cache, blocks, tile, num_keys, kv_head, s, kv_s);
    __syncthreads();
    float score[kRowsPerWarp];  // lane = key tile + lane
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) score[k] = 0.f;
    for (int d = 0; d < kHeadDim; ++d) {
      const float key = kv_s[lane][d];
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) score[k] += q_s[warp + kWarps * k][d] * key;
    }
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int r = warp + kWarps * k;
      if (r >= rows) break;  // warp-uniform
      const bool visible = tile + lane <= history + r / group;
      const float x = visible ? score[k] : -INFINITY;
      const float m_new = fmaxf(m[k], WarpMax(x));  // finite: key 0 is in every row's first tile
      const float p = exp2f(x - m_new);
      const float alpha = exp2f(m[k] - m_new);
      l[k] = l[k] * alpha + WarpSum(p);
      m[k] = m_new;
      p_s[r][lane] = p;
      if (lane == 0) alpha_s[r] = alpha;
    }
    __syncthreads();
    LoadKvTile<T, BlockIndex, kHeadDim>(value_cache, blocks, tile, num_keys, kv_head, s, kv_s);
    __syncthreads();
    const int keys_here = min(kKeys, num_keys - tile);
#pragma unroll
    for (int k = 0; k < kAccRows; ++k) {
      const int r = row_group + kRowGroups * k;
      if (r >= rows) break;
      float a = acc[k] * alpha_s[r];
      for (int t = 0; t < keys_here; ++t) a += p_s[r][t] * kv_s[t][column];
      acc[k] = a;
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      if (warp + kWarps * k < rows) l_s[warp + kWarps * k] = l[k];
    }
  }
  __syncthreads();
  const int64_t out_stride = static_cast<int64_t>(s.num_heads) * kHeadDim;
#pragma unroll
  for (int k = 0; k < kAccRows; ++k) {
    const int r = row_group + kRowGroups * k;
    if (r >= rows) break;
    const int64_t token = q_start + r / group, head = kv_head * group + r % group;
    out[token * out_stride + head * kHeadDim + column] = FromFloat<T>(acc[k] / l_s[r]);
  }
}

// Writes the cache, then attends. cudaErrorInvalidValue for an unsupported shape (head_dim not 64
// or 128, KV heads not dividing heads, more than kRows query heads per KV head).
template <typename T, typename BlockIndex>
cudaError_t LaunchAppendAttention(const T* qkv, T* key_cache, T* value_cache, const int64_t* slot_mapping,
                                  const BlockIndex* block_tables, const int* cu_seqlens_q,
                                  const int* seq_lens_decoder, T* out, const AppendAttentionShape& s,
                                  cudaStream_t stream) {
  using attention::kRows;
  using attention::kThreads;
  if (s.kv_heads <= 0 || s.num_heads % s.kv_heads != 0 || s.num_heads / s.kv_heads > kRows) {
    return cudaErrorInvalidValue;
  }
  if ((s.head_dim != 64 && s.head_dim != 128) || s.block_size <= 0) return cudaErrorInvalidValue;
  if (s.num_tokens == 0 || s.batch_size == 0) return cudaSuccess;
  const int64_t write_items = static_cast<int64_t>(s.num_tokens) * s.kv_heads * s.head_dim;
  const int write_blocks = static_cast<int>(CeilDiv(write_items, 256) < 4096 ? CeilDiv(write_items, 256) : 4096);
  WriteKvCacheKernel<T><<<write_blocks, 256, 0, stream>>>(qkv, slot_mapping, key_cache, value_cache, s);
  const int q_tile = kRows / (s.num_heads / s.kv_heads);
  // sum over requests of ceil(len / q_tile) <= num_tokens / q_tile + batch_size
  const dim3 grid(static_cast<unsigned>(CeilDiv(s.num_tokens, q_tile) + s.batch_size), s.kv_heads);
  if (s.head_dim == 64) {
    AppendAttentionKernel<T, BlockIndex, 64><<<grid, kThreads, 0, stream>>>(
        qkv, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens_decoder, out, s, q_tile);
  } else {
    AppendAttentionKernel<T, BlockIndex, 128><<<grid, kThreads, 0, stream>>>(
        qkv, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens_decoder, out, s, q_tile);
  }
  return cudaGetLastError();
}

}  // namespace fdgpu
