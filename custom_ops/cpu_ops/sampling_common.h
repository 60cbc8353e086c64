// Helpers shared by the sampling ops (sampling.cc) and the logprobs op (logprobs.cc): a vectorisable
// exp, a row maximum, and the k largest entries of a row in the sampler's order (larger value first,
// ties by lower id).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace fd_sampling {

// exp(x) for x <= 0 in float32 (Cephes' expf polynomial, ~1 ulp), 0 below -87 (and for -inf); written
// as plain arithmetic so that the compiler vectorises the loops calling it.
inline float ExpNonPositive(float x) {
  const bool underflow = x < -87.0f;
  x = std::max(x, -87.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693359375f, x);  // x - n ln2 in two steps (Cody-Waite)
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return underflow ? 0.0f : p * scale;
}

// The largest entry (-inf entries included). The pragma lets GCC vectorise this max without
// -ffinite-math-only, which the build does not use; GCC 12 does not vectorise it over std::max.
inline float RowMax(const float* x, int64_t n) {
  float best = x[0];
#pragma omp simd reduction(max : best)
  for (int64_t i = 1; i < n; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

struct Candidate {
  float value;
  int32_t id;
};

// The sampler's order: larger value first, ties by lower id (a strict total order).
inline bool Before(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

constexpr int64_t kChunk = 64;  // scans test a chunk at once (vectorised), then walk chunks with hits

inline int HitsAbove(const float* x, float threshold) {
  int hits = 0;
  for (int64_t i = 0; i < kChunk; ++i) hits += x[i] > threshold;
  return hits;
}

// The top_k first entries of x [n] in the order Before, unordered: of the positive entries only
// (weights) or of all (logits, -inf included). One scan keeps a buffer of at most 4k entries above a
// threshold that rises to the k-th largest whenever the buffer fills; later entries equal to the
// threshold have higher ids, so they rank after the k kept and are skipped. Fewer than top_k when x
// holds fewer (positive) entries.
inline void GatherTopK(const float* x, int64_t n, int64_t top_k, bool positive_only, std::vector<Candidate>& out) {
  const size_t k = static_cast<size_t>(top_k), capacity = std::max<size_t>(4 * k, 256);
  out.clear();
  out.reserve(capacity);
  bool open = !positive_only;  // every entry qualifies until the buffer first fills
  float threshold = 0.0f;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    if (!open && end - start == kChunk && HitsAbove(x + start, threshold) == 0) continue;
    for (int64_t i = start; i < end; ++i) {
      if (!open && !(x[i] > threshold)) continue;
      out.push_back({x[i], static_cast<int32_t>(i)});
      if (out.size() == capacity) {
        std::nth_element(out.begin(), out.begin() + (k - 1), out.end(), Before);
        out.resize(k);
        threshold = out[k - 1].value;
        open = false;
      }
    }
  }
  if (out.size() > k) {
    std::nth_element(out.begin(), out.begin() + (k - 1), out.end(), Before);
    out.resize(k);
  }
}

}  // namespace fd_sampling
