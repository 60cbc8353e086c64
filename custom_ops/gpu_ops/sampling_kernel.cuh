// Token sampling from logits, one thread block per row, CUDA (pure CUDA + CUB).
//
// Per row r (logits [num_rows, vocab] float32, read only):
//   temperature[r] <= 0: greedy, the argmax of the logits, ties to the lowest id.
//   otherwise, as the CPU sampler (fastdeploy/model_executor/layers/sample/sampler.py):
//     x = logits / temperature (float32), w = exp(x - max x) (= p / p_max, float32),
//     min-p: w = 0 where w < min_p[r]; then
//     - top_k[r] <= 0 and top_p[r] >= 1: inverse CDF over w in id order: the first id whose
//       cumulative weight exceeds uniforms[r] * sum(w);
//     - otherwise, in sorted order (w descending, ties by ascending id; zero weights dropped):
//       keep the first top_k[r] (when > 0); of those keep token j while the mass before it is
//       < top_p[r] * (mass kept by top-k) (the top token always stays); draw the first kept token
//       whose cumulative weight exceeds uniforms[r] * (mass kept). The draw is renormalised over
//       the kept tokens; one uniform in [0, 1) per row.
//   Rounding at a boundary falls back to the last eligible token, as the CPU sampler does.
// Top-p is relative to the whole top-k set here; the CPU sampler computes it over a candidate
// subset (weights >= a cut that holds top_p of the mass), which differs when the excluded tail
// is not negligible.
//
// No sort: each selection ("the element where the cumulative count or mass in sorted order
// crosses a target") is a radix descent over the float bits of w (non-negative floats order as
// their bit patterns), 4 bits per pass, with cumulative per-digit counts and float64 masses
// summed by deterministic block reductions (no atomics: the same inputs give the same token on
// every run). Ties at the selected value are resolved by id with one scan.
//
// Shapes: temperature, top_p, min_p [num_rows] float32; top_k [num_rows] int64;
// uniforms [num_rows] float64; workspace [num_rows, vocab] float32 (holds w); token_ids
// [num_rows] int64 (out).
#pragma once

#include <cub/block/block_scan.cuh>

#include <climits>

#include "gpu_common.cuh"

namespace fdgpu {

namespace sampling {
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 4;
constexpr int kDigits = 1 << kDigitBits;

// A position in sorted order (weight descending, id ascending); an element is at or before it when
// w > value, or w == value and id <= id.
struct Cut {
  float value;
  int id;
};

// The selected element and the mass of the eligible elements up to and including it.
struct Through {
  Cut cut;
  double mass;
};

enum class Crossing { kCount, kMassAtLeast, kMassAbove };

struct Scratch {
  double mass[kWarps * kDigits];
  int count[kWarps * kDigits];
  float best_value[kWarps];
  int best_id[kWarps];
  int found;
  typename cub::BlockScan<int, kThreads>::TempStorage int_scan;
  typename cub::BlockScan<double, kThreads>::TempStorage double_scan;
};

__device__ __forceinline__ bool Eligible(float w, int id, Cut limit) {
  return w > 0.f && (w > limit.value || (w == limit.value && id <= limit.id));
}

__device__ __forceinline__ bool Crosses(Crossing crossing, double mass, int count, double target) {
  switch (crossing) {
    case Crossing::kCount:
      return count >= target;
    case Crossing::kMassAtLeast:
      return mass >= target;
    default:
      return mass > target;
  }
}

// Argmax of x[0..n), ties to the lowest index (NaN never wins; all NaN gives 0).
__device__ int BlockArgMax(const float* __restrict__ x, int n, Scratch& sh) {
  float best = -INFINITY;
  int best_id = INT_MAX;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = x[i];
    if (v > best || (v == best && i < best_id)) best = v, best_id = i;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, best, offset);
    const int id = __shfl_xor_sync(kFullMask, best_id, offset);
    if (v > best || (v == best && id < best_id)) best = v, best_id = id;
  }
  if (threadIdx.x % 32 == 0) sh.best_value[threadIdx.x / 32] = best, sh.best_id[threadIdx.x / 32] = best_id;
  __syncthreads();
  best = sh.best_value[0], best_id = sh.best_id[0];
  for (int w = 1; w < kWarps; ++w) {
    const float v = sh.best_value[w];
    if (v > best || (v == best && sh.best_id[w] < best_id)) best = v, best_id = sh.best_id[w];
  }
  __syncthreads();
  return best_id == INT_MAX ? 0 : best_id;
}

__device__ float BlockMaxScaled(const float* __restrict__ x, int n, float temperature, Scratch& sh) {
  float best = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kThreads) best = fmaxf(best, __fdiv_rn(x[i], temperature));
  best = WarpMax(best);
  if (threadIdx.x % 32 == 0) sh.best_value[threadIdx.x / 32] = best;
  __syncthreads();
  best = sh.best_value[0];
  for (int w = 1; w < kWarps; ++w) best = fmaxf(best, sh.best_value[w]);
  __syncthreads();
  return best;
}

// The t-th (1-based) element of x equal to `value` and eligible under `limit`, in id order.
__device__ int NthTie(const float* __restrict__ x, int n, float value, Cut limit, int t, Scratch& sh) {
  using Scan = cub::BlockScan<int, kThreads>;
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  int carry = 0;
  for (int base = 0; base < n && carry < t; base += kThreads) {  // carry is block-uniform
    const int i = base + threadIdx.x;
    const int flag = i < n && x[i] == value && Eligible(value, i, limit);
    int before, chunk;
    Scan(sh.int_scan).ExclusiveSum(flag, before, chunk);
    if (flag && carry + before + 1 == t) sh.found = i;
    carry += chunk;
    __syncthreads();
  }
  __syncthreads();
  const int found = sh.found;
  __syncthreads();
  return found;
}

// The element of w (eligible under `limit`) at which the cumulative count or mass, in sorted
// order, first crosses `target`; the last eligible element when nothing crosses.
__device__ Through SelectInSortedOrder(const float* __restrict__ w, int n, Cut limit, Crossing crossing,
                                       double target, Scratch& sh) {
  uint32_t prefix = 0;     // bits of the selected value decided so far
  double above_mass = 0.;  // eligible elements with values above the current bit range
  int above_count = 0, ties = 0;
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    const uint32_t range_mask = shift + kDigitBits >= 32 ? 0u : ~0u << (shift + kDigitBits);
    double mass[kDigits];  // eligible elements in the current range with digit >= d
    int count[kDigits];
#pragma unroll
    for (int d = 0; d < kDigits; ++d) mass[d] = 0., count[d] = 0;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float x = w[i];
      const uint32_t bits = __float_as_uint(x);
      if ((bits & range_mask) != prefix || !Eligible(x, i, limit)) continue;
      const uint32_t digit = (bits >> shift) & (kDigits - 1);
#pragma unroll
      for (int d = 0; d < kDigits; ++d) {
        if (digit >= static_cast<uint32_t>(d)) mass[d] += x, count[d] += 1;
      }
    }
    BlockSumArray<kThreads>(mass, sh.mass);
    BlockSumArray<kThreads>(count, sh.count);
    // from the top digit down: the first non-empty digit whose cumulative total crosses the
    // target, else the last non-empty digit (fully unrolled: the arrays stay in registers)
    int pick = 0, pick_count = 0;
    double pick_above_mass = 0.;
    int pick_above_count = 0;
    bool crossed = false;
#pragma unroll
    for (int d = kDigits - 1; d >= 0; --d) {
      const double higher_mass = d + 1 < kDigits ? mass[d + 1] : 0.;
      const int higher_count = d + 1 < kDigits ? count[d + 1] : 0;
      if (!crossed && count[d] > higher_count) {
        pick = d, pick_count = count[d] - higher_count;
        pick_above_mass = higher_mass, pick_above_count = higher_count;
        crossed = Crosses(crossing, above_mass + mass[d], above_count + count[d], target);
      }
    }
    above_mass += pick_above_mass;
    above_count += pick_above_count;
    ties = pick_count;
    prefix |= static_cast<uint32_t>(pick) << shift;
  }
  const float value = __uint_as_float(prefix);
  double t;  // which tie (in id order) crosses
  if (crossing == Crossing::kCount) {
    t = target - above_count;
  } else {
    const double need = (target - above_mass) / value;
    t = crossing == Crossing::kMassAtLeast ? ceil(need) : floor(need) + 1.;
  }
  const int tie = static_cast<int>(fmin(fmax(t, 1.), static_cast<double>(ties)));
  const int id = ties > 0 ? NthTie(w, n, value, limit, tie, sh) : -1;
  return {{value, id}, above_mass + tie * static_cast<double>(value)};
}

// Inverse CDF in id order: the first id whose cumulative weight exceeds target; the last positive
// weight when none does.
__device__ int DrawInIdOrder(const float* __restrict__ w, int n, double target, Scratch& sh) {
  using Scan = cub::BlockScan<double, kThreads>;
  double carry = 0.;
  int last_positive = -1;
  for (int base = 0; base < n; base += kThreads) {
    const int i = base + threadIdx.x;
    const float x = i < n ? w[i] : 0.f;
    if (x > 0.f) last_positive = i;
    if (threadIdx.x == 0) sh.found = INT_MAX;
    __syncthreads();
    double cumulative, chunk;
    Scan(sh.double_scan).InclusiveSum(static_cast<double>(x), cumulative, chunk);
    if (x > 0.f && carry + cumulative > target) atomicMin(&sh.found, i);
    carry += chunk;
    __syncthreads();
    const int found = sh.found;
    __syncthreads();
    if (found != INT_MAX) return found;
  }
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  atomicMax(&sh.found, last_positive);
  __syncthreads();
  return sh.found;
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab, const float* __restrict__ temperature,
                 const int64_t* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ min_p,
                 const double* __restrict__ uniforms, float* __restrict__ workspace, int64_t* __restrict__ token_ids) {
  __shared__ Scratch sh;
  const int row = blockIdx.x;
  const float* x = logits + static_cast<int64_t>(row) * vocab;
  float* w = workspace + static_cast<int64_t>(row) * vocab;
  const float t = temperature[row];
  if (!(t > 0.f)) {
    const int id = BlockArgMax(x, vocab, sh);
    if (threadIdx.x == 0) token_ids[row] = id;
    return;
  }
  const float x_max = BlockMaxScaled(x, vocab, t, sh);
  const float cut = min_p[row];
  double total[1] = {0.};
  int positives[1] = {0};
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    // exp in float64, rounded once: fast-math's __expf would move weights by several ulps
    float v = static_cast<float>(exp(static_cast<double>(__fsub_rn(__fdiv_rn(x[i], t), x_max))));
    if (cut > 0.f && v < cut) v = 0.f;
    w[i] = v;
    total[0] += v;
    positives[0] += v > 0.f;
  }
  BlockSumArray<kThreads>(total, sh.mass);  // also orders the w writes before the reads below
  BlockSumArray<kThreads>(positives, sh.count);
  const int64_t k = top_k[row];
  const float p = top_p[row];
  const double u = uniforms[row];
  int token;
  if (k <= 0 && p >= 1.f) {
    token = DrawInIdOrder(w, vocab, u * total[0], sh);
  } else {
    Cut keep{0.f, INT_MAX};  // every positive weight
    double kept = total[0];
    if (k > 0 && k < positives[0]) {
      const Through top_k_set = SelectInSortedOrder(w, vocab, keep, Crossing::kCount, static_cast<double>(k), sh);
      keep = top_k_set.cut, kept = top_k_set.mass;
    }
    if (p < 1.f) {
      const Through nucleus = SelectInSortedOrder(w, vocab, keep, Crossing::kMassAtLeast, p * kept, sh);
      keep = nucleus.cut, kept = nucleus.mass;
    }
    token = SelectInSortedOrder(w, vocab, keep, Crossing::kMassAbove, u * kept, sh).cut.id;
  }
  if (threadIdx.x == 0) token_ids[row] = token < 0 ? 0 : token;
}

}  // namespace sampling

inline cudaError_t LaunchSample(const float* logits, int num_rows, int vocab, const float* temperature,
                                const int64_t* top_k, const float* top_p, const float* min_p, const double* uniforms,
                                float* workspace, int64_t* token_ids, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  sampling::SampleKernel<<<num_rows, sampling::kThreads, 0, stream>>>(logits, vocab, temperature, top_k, top_p,
                                                                      min_p, uniforms, workspace, token_ids);
  return cudaGetLastError();
}

}  // namespace fdgpu
