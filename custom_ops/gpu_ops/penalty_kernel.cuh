// Repetition / frequency / presence penalties on logits, in place, CUDA. Same rule and the same
// float32 rounding as the CPU path (fastdeploy/model_executor/layers/sample/penalties.py, after
// FastDeploy's get_token_penalty_multi_scores), so the results are bitwise equal to it:
//
// For each sparse entry e (one per (row, token) seen by that row in its prompt or output):
//   l = logits[rows[e], token_ids[e]]
//   l = l > 0 ? l / repetition[row] : l * repetition[row]
//   l = l - (frequency[row] * output_counts[e] + presence[row] * (output_counts[e] > 0))
//
// logits [num_rows, vocab] float32; rows, token_ids [m] int64; output_counts [m] float32;
// repetition, frequency, presence [num_rows] float32. Entries must name distinct (row, token)
// pairs (each logit is read and written by one thread).
#pragma once

#include "gpu_common.cuh"

namespace fdgpu {

__global__ void TokenPenaltyKernel(float* __restrict__ logits, int64_t vocab, const int64_t* __restrict__ rows,
                                   const int64_t* __restrict__ token_ids, const float* __restrict__ output_counts,
                                   int64_t num_entries, const float* __restrict__ repetition,
                                   const float* __restrict__ frequency, const float* __restrict__ presence) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < num_entries;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = rows[e];
    float* logit = logits + row * vocab + token_ids[e];
    const float count = output_counts[e];
    // explicit round-to-nearest ops: no FMA contraction and no fast-math division, as in numpy
    float l = *logit > 0.f ? __fdiv_rn(*logit, repetition[row]) : __fmul_rn(*logit, repetition[row]);
    const float penalty = __fadd_rn(__fmul_rn(frequency[row], count), count > 0.f ? presence[row] : 0.f);
    *logit = __fsub_rn(l, penalty);
  }
}

inline cudaError_t LaunchTokenPenalty(float* logits, int64_t vocab, const int64_t* rows, const int64_t* token_ids,
                                      const float* output_counts, int64_t num_entries, const float* repetition,
                                      const float* frequency, const float* presence, cudaStream_t stream) {
  if (num_entries == 0) return cudaSuccess;
  const int64_t blocks = CeilDiv(num_entries, 256) < 1024 ? CeilDiv(num_entries, 256) : 1024;
  TokenPenaltyKernel<<<static_cast<int>(blocks), 256, 0, stream>>>(logits, vocab, rows, token_ids, output_counts,
                                                                   num_entries, repetition, frequency, presence);
  return cudaGetLastError();
}

}  // namespace fdgpu
