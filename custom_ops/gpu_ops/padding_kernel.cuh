// Padded <-> packed token layouts, CUDA: FastDeploy's get_padding_offset and rebuild_padding.
//
// get_padding_offset: input_ids [batch_size, max_len] int64, seq_lens [batch_size] int32
// (0 <= seq_lens[i] <= max_len; the caller checks) ->
//   cu_seqlens     [batch_size + 1] int32   prefix sums of seq_lens, cu_seqlens[0] = 0
//   ids            [num_tokens] int64       the first seq_lens[i] ids of each row, rows in order
//   padding_offset [num_tokens] int32       padding slots before each packed token, so packed
//                                           token k sits at flat position k + padding_offset[k] of
//                                           input_ids (i * max_len - cu_seqlens[i] for request i)
// num_tokens = cu_seqlens[batch_size] must be known by the caller to size ids and padding_offset.
//
// rebuild_padding: hidden [num_tokens, hidden_size] (packed), cu_seqlens [batch_size + 1] ->
//   out [batch_size, hidden_size]: the last token of each request (the one whose logits are
//   sampled), zeros for a request with no tokens this step.
#pragma once

#include <cub/block/block_scan.cuh>

#include "gpu_common.cuh"

namespace fdgpu {

namespace padding {
constexpr int kThreads = 256;
}

// One thread block: chunked exclusive scan of seq_lens.
__global__ void __launch_bounds__(padding::kThreads)
    CuSeqlensKernel(const int* __restrict__ seq_lens, int batch_size, int* __restrict__ cu_seqlens) {
  using Scan = cub::BlockScan<int, padding::kThreads>;
  __shared__ typename Scan::TempStorage storage;
  int carry = 0;
  if (threadIdx.x == 0) cu_seqlens[0] = 0;
  for (int base = 0; base < batch_size; base += padding::kThreads) {
    const int i = base + threadIdx.x;
    int inclusive, chunk_total;
    Scan(storage).InclusiveSum(i < batch_size ? seq_lens[i] : 0, inclusive, chunk_total);
    if (i < batch_size) cu_seqlens[i + 1] = carry + inclusive;
    carry += chunk_total;
    __syncthreads();  // storage reused by the next chunk
  }
}

// Grid: one thread block per request.
__global__ void RemovePaddingKernel(const int64_t* __restrict__ input_ids, const int* __restrict__ cu_seqlens,
                                    int max_len, int64_t* __restrict__ ids, int* __restrict__ padding_offset) {
  const int i = blockIdx.x;
  const int start = cu_seqlens[i], len = cu_seqlens[i + 1] - start;
  const int offset = i * max_len - start;
  for (int j = threadIdx.x; j < len; j += blockDim.x) {
    ids[start + j] = input_ids[static_cast<int64_t>(i) * max_len + j];
    padding_offset[start + j] = offset;
  }
}

// Grid: one thread block per request.
template <typename T>
__global__ void RebuildPaddingKernel(const T* __restrict__ hidden, const int* __restrict__ cu_seqlens,
                                     int hidden_size, T* __restrict__ out) {
  const int i = blockIdx.x;
  const int start = cu_seqlens[i], end = cu_seqlens[i + 1];
  T* dst = out + static_cast<int64_t>(i) * hidden_size;
  if (end == start) {
    for (int d = threadIdx.x; d < hidden_size; d += blockDim.x) dst[d] = FromFloat<T>(0.f);
    return;
  }
  const T* src = hidden + static_cast<int64_t>(end - 1) * hidden_size;
  for (int d = threadIdx.x; d < hidden_size; d += blockDim.x) dst[d] = src[d];
}

inline cudaError_t LaunchGetPaddingOffset(const int64_t* input_ids, const int* seq_lens, int batch_size,
                                          int max_len, int64_t* ids, int* padding_offset, int* cu_seqlens,
                                          cudaStream_t stream) {
  CuSeqlensKernel<<<1, padding::kThreads, 0, stream>>>(seq_lens, batch_size, cu_seqlens);
  if (batch_size > 0) {
    RemovePaddingKernel<<<batch_size, padding::kThreads, 0, stream>>>(input_ids, cu_seqlens, max_len, ids,
                                                                      padding_offset);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchRebuildPadding(const T* hidden, const int* cu_seqlens, int batch_size, int hidden_size, T* out,
                                 cudaStream_t stream) {
  if (batch_size == 0) return cudaSuccess;
  RebuildPaddingKernel<T><<<batch_size, padding::kThreads, 0, stream>>>(hidden, cu_seqlens, hidden_size, out);
  return cudaGetLastError();
}

}  // namespace fdgpu
