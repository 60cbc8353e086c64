// Shared device helpers of the gpu_ops kernels: element-type conversions and deterministic block
// reductions. Pure CUDA (no Paddle headers), so the kernels also build into the ctypes harness.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fdgpu {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename V>
__device__ __forceinline__ V WarpSum(V v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sums each of v[0..N) over the block; every thread gets the totals. The summation order is fixed
// (warp tree, then warps in order), so results are bitwise reproducible run to run.
// scratch: kThreads / 32 * N elements of shared memory.
template <int kThreads, int N, typename V>
__device__ __forceinline__ void BlockSumArray(V (&v)[N], V* scratch) {
  constexpr int kWarps = kThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = WarpSum(v[i]);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) scratch[warp * N + i] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    V total = scratch[i];
    for (int w = 1; w < kWarps; ++w) total += scratch[w * N + i];
    v[i] = total;
  }
  __syncthreads();  // scratch may be reused right away
}

__host__ __device__ __forceinline__ int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace fdgpu
