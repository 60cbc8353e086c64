// A packed token bitmask applied to float32 logit rows, in place, CUDA (structured outputs). Same
// rule as the CPU op (custom_ops/cpu_ops/token_bitmask.cc) and its numpy reference
// (fastdeploy/model_executor/layers/sample/token_bitmask.py):
//
// logits  [num_rows, vocab] float32, updated in place
// bitmask [m, num_words] int32: bit t % 32 of word t / 32 set = token t allowed; tokens at or past
//         32 * num_words are not allowed
// indices [m] int64: the logits row of bitmask row i. An index outside [0, num_rows) is skipped
//         (the Paddle op rejects it before the launch); a row named twice gets the union of bans.
// Every token not allowed becomes -inf; allowed logits are never read or written (their bits stay).
//
// Grid: x over chunks of a row's tokens, y over bitmask rows. Each thread owns kVec consecutive
// tokens (4: one float4 store where all are banned, when the row is 16-byte aligned; else 1), so a
// warp stores one contiguous span; its bitmask word is shared by 32 / kVec neighbouring threads.
#pragma once

#include "gpu_common.cuh"

namespace fdgpu {

constexpr int kBitmaskThreads = 256;

template <int kVec>
__global__ void ApplyTokenBitmaskKernel(float* __restrict__ logits, int64_t num_rows, int64_t vocab,
                                        const int32_t* __restrict__ bitmask, int64_t num_words,
                                        const int64_t* __restrict__ indices, int64_t m) {
  const float neg_inf = __uint_as_float(0xff800000u);
  const int64_t t = (blockIdx.x * static_cast<int64_t>(kBitmaskThreads) + threadIdx.x) * kVec;
  if (t >= vocab) return;
  const int64_t w = t / 32;
  for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
    const int64_t row = indices[i];
    if (row < 0 || row >= num_rows) continue;
    const uint32_t word = w < num_words ? static_cast<uint32_t>(__ldg(bitmask + i * num_words + w)) : 0u;
    const uint32_t bits = (word >> (t % 32)) & ((1u << kVec) - 1u);  // this thread's tokens, 1 = allowed
    float* p = logits + row * vocab + t;
    if (kVec == 4 && bits == 0u) {
      *reinterpret_cast<float4*>(p) = make_float4(neg_inf, neg_inf, neg_inf, neg_inf);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (!((bits >> k) & 1u)) p[k] = neg_inf;
      }
    }
  }
}

// kVec 4 needs vocab % 4 == 0 and a 16-byte aligned logits pointer (then every row is aligned and no
// group of 4 straddles the row's end); otherwise one token per thread.
inline cudaError_t LaunchApplyTokenBitmask(float* logits, int64_t num_rows, int64_t vocab, const int32_t* bitmask,
                                           int64_t num_words, const int64_t* indices, int64_t m,
                                           cudaStream_t stream) {
  if (m == 0 || vocab == 0) return cudaSuccess;
  const bool vec4 = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  const int64_t per_block = kBitmaskThreads * (vec4 ? 4 : 1);
  const dim3 grid(static_cast<unsigned>(CeilDiv(vocab, per_block)), static_cast<unsigned>(m < 65535 ? m : 65535));
  if (vec4) {
    ApplyTokenBitmaskKernel<4><<<grid, kBitmaskThreads, 0, stream>>>(logits, num_rows, vocab, bitmask, num_words,
                                                                     indices, m);
  } else {
    ApplyTokenBitmaskKernel<1><<<grid, kBitmaskThreads, 0, stream>>>(logits, num_rows, vocab, bitmask, num_words,
                                                                     indices, m);
  }
  return cudaGetLastError();
}

}  // namespace fdgpu
