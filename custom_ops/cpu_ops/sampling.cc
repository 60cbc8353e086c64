// Token sampling on CPU from float32 logits: greedy argmax, or softmax(logits / T) filtered by min-p,
// top-k and top-p, then one inverse-CDF draw with the row's own uniform number.
//
// Reference: fastdeploy/model_executor/layers/sample/draw.py (numpy), same rules and same CDF order,
// so one uniform draws the same token up to float rounding at CDF and filter boundaries:
//   temperature 0: the first index of the maximum logit (ties: lowest id);
//   else w = exp(l / T - max(l) / T) (= p / p_max), w < min_p -> 0;
//   no top-k/top-p: the draw walks the CDF in token-id order (blocks of 1024 first, then inside one);
//   else in the order "larger w first, ties by lower id": the top_k first tokens, then the smallest
//   prefix of those whose mass before each token stays below top_p x their mass; the draw walks the
//   CDF of that prefix in that order.
// Nothing is sorted in full: top-k candidates come from one scan with a rising threshold, top-p
// candidates from a weight cut (lowered from 1e-3 until they hold top_p of the mass), and the top-p
// boundary and the drawn token are found by quickselect on cumulative mass.
// A row whose logits are all -inf (or NaN) returns an index of its maximum, never one out of range.
// Rows run in parallel (OpenMP, ForEachRow) once the batch is large enough (kParallelWork).
//
// logits: [rows, vocab] float32, not modified
// params: [rows, 5] float64: temperature (0 = greedy), top_k (0 = off), top_p (1 = off),
//         min_p (0 = off), uniform in [0, 1)
// out:    [rows] int64 token ids
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "paddle/extension.h"
#include "sampling_common.h"

namespace {
using fd_sampling::Before;
using fd_sampling::Candidate;
using fd_sampling::ExpNonPositive;
using fd_sampling::GatherTopK;
using fd_sampling::HitsAbove;
using fd_sampling::kChunk;
using fd_sampling::RowMax;

constexpr int64_t kBlock = 1024;            // token-id-order draw: block sums first
constexpr float kFirstCut = 1e-3f;          // first candidate cut, in units of p_max
// Logits in a batch worth running rows on several threads (2^20: 4 MB of float32). On 2 shared cores
// with other processes running, two threads were slower (SmolLM2's 32 x 49152: 1.6 ms per greedy step
// against 1.0 on one), so this was 2^24; on a quiet Intel Xeon (2 vCPU) ERNIE-4.5-0.3B's 32 x 103424
// greedy rows take 0.35 ms on two threads against numpy's 0.49 ms on one (benchmarks/README.md at commit 9c89004,
// "Decode attention on AMX tiles").
constexpr int64_t kParallelWork = int64_t(1) << 20;

// The first index of the maximum in one pass: the maximum of each chunk of 256 (vectorised), the
// first chunk holding the row's maximum, then a scan of that chunk. 0 for a row of NaNs.
int64_t Argmax(const float* x, int64_t n) {
  constexpr int64_t kSpan = 256;
  float best = x[0];
  int64_t best_start = 0;
  for (int64_t start = 0; start < n; start += kSpan) {
    const int64_t end = std::min(n, start + kSpan);
    float m = x[start];
#pragma omp simd reduction(max : m)
    for (int64_t i = start + 1; i < end; ++i) m = x[i] > m ? x[i] : m;
    if (m > best) {
      best = m;
      best_start = start;
    }
  }
  for (int64_t i = best_start; i < std::min(n, best_start + kSpan); ++i)
    if (x[i] == best) return i;
  return 0;
}

struct Weights {
  double total = 0.0;    // sum of w
  int64_t at_cut = 0;    // tokens with w >= kFirstCut
  double mass_at_cut = 0.0;
};

// w[i] = exp(x[i] / T - max / T), zeroed below min_p; block_sums[b] = sum of w over block b.
Weights ComputeWeights(const float* x, int64_t n, float max_x, float temperature, float min_p, float* w,
                       std::vector<double>& block_sums) {
  const float inv_t = 1.0f / temperature;
  const float top = max_x * inv_t;
  Weights out;
  block_sums.assign((n + kBlock - 1) / kBlock, 0.0);
  for (int64_t start = 0, b = 0; start < n; start += kBlock, ++b) {
    const int64_t end = std::min(n, start + kBlock);
    // two loops: GCC 12 miscompiled this store fused with the mixed-type reduction below
#pragma omp simd
    for (int64_t i = start; i < end; ++i) {
      const float v = ExpNonPositive(x[i] * inv_t - top);
      w[i] = v < min_p ? 0.0f : v;
    }
    double sum = 0.0, mass = 0.0;
    int64_t count = 0;
#pragma omp simd reduction(+ : sum, mass, count)
    for (int64_t i = start; i < end; ++i) {
      sum += w[i];
      const bool candidate = w[i] >= kFirstCut;
      count += candidate;
      mass += candidate ? w[i] : 0.0f;
    }
    block_sums[b] = sum;
    out.total += sum;
    out.at_cut += count;
    out.mass_at_cut += mass;
  }
  return out;
}

// Index i with cum(w[0..i]) > target, the first such; the last non-zero weight when none is; -1
// when every weight is zero.
int64_t WalkCdf(const float* w, int64_t n, double target) {
  double cum = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (w[i] <= 0.0f) continue;
    cum += w[i];
    last = i;
    if (cum > target) return i;
  }
  return last;
}

// Inverse-CDF draw in token-id order: the block holding u x total, then the token inside it.
int64_t DrawById(const float* w, int64_t n, const std::vector<double>& block_sums, double total, double u) {
  const int64_t blocks = static_cast<int64_t>(block_sums.size());
  int64_t last_nonzero = blocks - 1;
  while (last_nonzero > 0 && block_sums[last_nonzero] <= 0.0) --last_nonzero;
  const double target = u * total;
  double before = 0.0;
  int64_t b = 0;
  for (; b < last_nonzero && before + block_sums[b] <= target; ++b) before += block_sums[b];
  const int64_t start = b * kBlock;
  const int64_t i = WalkCdf(w + start, std::min(n, start + kBlock) - start, std::max(target - before, 0.0));
  return i < 0 ? -1 : start + i;
}

// Tokens with w >= cut (w > 0 when cut is 0): how many, and their mass.
std::pair<int64_t, double> CountAtLeast(const float* w, int64_t n, float cut) {
  int64_t count = 0;
  double mass = 0.0;
#pragma omp simd reduction(+ : count, mass)
  for (int64_t i = 0; i < n; ++i) {
    const bool in = cut > 0.0f ? w[i] >= cut : w[i] > 0.0f;
    count += in;
    mass += in ? w[i] : 0.0f;
  }
  return {count, mass};
}

// Candidates holding the whole nucleus of top_p, unordered: tokens with w >= cut, the cut lowered
// from kFirstCut until they hold top_p of the mass. Tokens below the cut come after the candidates in
// sorted order, so each has at least top_p of the mass before it: none is in the nucleus.
void GatherNucleus(const float* w, int64_t n, const Weights& weights, double top_p, std::vector<Candidate>& out) {
  float cut = kFirstCut;
  std::pair<int64_t, double> found{weights.at_cut, weights.mass_at_cut};
  while (cut > 0.0f && found.second < top_p * weights.total) {
    cut = cut > 1e-12f ? cut * 1e-3f : 0.0f;
    found = CountAtLeast(w, n, cut);
  }
  const float above = cut > 0.0f ? std::nextafter(cut, 0.0f) : 0.0f;  // w > above  <=>  w >= cut
  out.resize(found.first);
  size_t count = 0;
  for (int64_t start = 0; start < n && count < out.size(); start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    if (end - start == kChunk && HitsAbove(w + start, above) == 0) continue;
    for (int64_t i = start; i < end; ++i)
      if (w[i] > above && count < out.size()) out[count++] = {w[i], static_cast<int32_t>(i)};
  }
  out.resize(count);
}

// Partitions c[lo, hi) around a median-of-three pivot: tokens sorted before it, then the pivot, then
// the rest. Returns the pivot's position.
size_t Partition(std::vector<Candidate>& c, size_t lo, size_t hi) {
  size_t a = lo, b = lo + (hi - lo) / 2, z = hi - 1;
  if (Before(c[b], c[a])) std::swap(a, b);
  if (Before(c[z], c[b])) b = Before(c[z], c[a]) ? a : z;  // b: the median of the three
  std::swap(c[b], c[hi - 1]);
  const Candidate pivot = c[hi - 1];
  const auto split = std::partition(c.begin() + lo, c.begin() + (hi - 1),
                                    [&](const Candidate& t) { return Before(t, pivot); });
  std::swap(*split, c[hi - 1]);
  return static_cast<size_t>(split - c.begin());
}

// Position p (in [lo, hi)) of the first token, in sorted order, whose cumulative mass (the mass of
// the tokens sorted ahead of it, itself included) reaches `target` (>= when inclusive, else >); hi
// when none does. Quickselect on mass: only the part holding the crossing is partitioned further, so
// [lo, p] ends up holding exactly the tokens sorted up to p, unordered, at expected O(hi - lo) cost
// instead of a sort.
size_t CrossingByMass(std::vector<Candidate>& c, size_t lo, size_t hi, double target, bool inclusive) {
  double before = 0.0;
  const auto reaches = [&](double cum) { return inclusive ? cum >= target : cum > target; };
  while (hi - lo > 16) {
    const size_t p = Partition(c, lo, hi);
    double mass = 0.0;
#pragma omp simd reduction(+ : mass)
    for (size_t j = lo; j < p; ++j) mass += c[j].value;
    if (reaches(before + mass)) {
      hi = p;
    } else if (reaches(before + mass + c[p].value)) {
      return p;
    } else {
      before += mass + c[p].value;
      lo = p + 1;
    }
  }
  std::sort(c.begin() + lo, c.begin() + hi, Before);
  for (size_t j = lo; j < hi; ++j) {
    before += c[j].value;
    if (reaches(before)) return j;
  }
  return hi;
}

// top-k (already applied by the gather), then top-p, then the draw, in sorted order. `mass`: the
// mass top-p renormalises, that of the top-k tokens or of every token.
int64_t DrawFromCandidates(std::vector<Candidate>& c, double mass, double top_p, double u) {
  if (c.empty()) return -1;
  // the nucleus: tokens whose mass before them is < top_p x mass, i.e. up to the first whose
  // cumulative mass reaches it
  const size_t kept = top_p < 1.0 ? std::min(c.size(), CrossingByMass(c, 0, c.size(), top_p * mass, true) + 1)
                                  : c.size();
  double kept_mass = 0.0;
#pragma omp simd reduction(+ : kept_mass)
  for (size_t j = 0; j < kept; ++j) kept_mass += c[j].value;
  const size_t drawn = CrossingByMass(c, 0, kept, u * kept_mass, false);
  if (drawn < kept) return c[drawn].id;
  return std::min_element(c.begin(), c.begin() + kept, [](const Candidate& a, const Candidate& b) {
           return Before(b, a);
         })->id;  // rounding put the target past the end: the last kept token
}

int64_t DrawFiltered(const float* w, int64_t n, const Weights& weights, int64_t top_k, double top_p, double u,
                     std::vector<Candidate>& candidates) {
  if (top_k <= 0) {
    GatherNucleus(w, n, weights, top_p, candidates);
    return DrawFromCandidates(candidates, weights.total, top_p, u);
  }
  GatherTopK(w, n, top_k, /*positive_only=*/true, candidates);
  double mass = 0.0;
#pragma omp simd reduction(+ : mass)
  for (size_t j = 0; j < candidates.size(); ++j) mass += candidates[j].value;
  return DrawFromCandidates(candidates, mass, top_p, u);
}

struct Scratch {
  std::unique_ptr<float[]> w;
  std::vector<double> block_sums;
  std::vector<Candidate> candidates;
};

int64_t SampleRow(const float* x, int64_t vocab, const double* p, Scratch& scratch) {
  const double temperature = p[0], top_p = p[2], u = p[4];
  const int64_t top_k = p[1] < static_cast<double>(vocab) ? static_cast<int64_t>(p[1]) : vocab;
  if (temperature <= 0.0) return Argmax(x, vocab);
  const float max_x = RowMax(x, vocab);
  if (!(max_x > -FLT_MAX)) return Argmax(x, vocab);  // every logit -inf
  float* w = scratch.w.get();
  const Weights weights = ComputeWeights(x, vocab, max_x, static_cast<float>(temperature),
                                         static_cast<float>(p[3]), w, scratch.block_sums);
  const int64_t id = top_k <= 0 && top_p >= 1.0 ? DrawById(w, vocab, scratch.block_sums, weights.total, u)
                                                 : DrawFiltered(w, vocab, weights, top_k, top_p, u, scratch.candidates);
  return id >= 0 ? id : Argmax(x, vocab);  // -1: no positive weight (NaN logits)
}

// Runs row(r, state) once for every r in [0, rows): on the OpenMP team when `parallel`, else on the
// calling thread; each thread gets its own state from make_state(). Rows go to whichever thread asks
// next (an atomic counter: rows differ in cost, greedy against filtered). Not `omp for
// schedule(dynamic)`: see custom_ops/README.md, "OpenMP runtime". fd_sampling_row_visits (below)
// reports what this does, for tests.
template <typename MakeState, typename Row>
void ForEachRow(int64_t rows, bool parallel, const MakeState& make_state, const Row& row) {
  std::atomic<int64_t> next{0};
#pragma omp parallel if (parallel)
  {
    auto state = make_state();
    for (int64_t r = next++; r < rows; r = next++) row(r, state);
  }
}
}  // namespace

std::vector<paddle::Tensor> TopKTopPMinPSampling(const paddle::Tensor& logits, const paddle::Tensor& params) {
  PD_CHECK(logits.is_cpu() && params.is_cpu(), "fd_top_k_top_p_min_p_sampling runs on CPU tensors");
  PD_CHECK(logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2,
           "logits must be float32 [rows, vocab]");
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  PD_CHECK(params.dtype() == paddle::DataType::FLOAT64 && params.shape().size() == 2 &&
               params.shape()[0] == rows && params.shape()[1] == 5,
           "params must be float64 [rows, 5] (temperature, top_k, top_p, min_p, uniform)");
  PD_CHECK(vocab > 0 && vocab <= INT32_MAX, "vocab must be in [1, 2^31)");
  auto out = paddle::empty({rows}, paddle::DataType::INT64, paddle::CPUPlace());
  const float* x = logits.data<float>();
  const double* p = params.data<double>();
  int64_t* ids = out.data<int64_t>();
  ForEachRow(
      rows, rows > 1 && rows * vocab >= kParallelWork,
      [vocab] { return Scratch{std::unique_ptr<float[]>(new float[vocab]), {}, {}}; },
      [&](int64_t r, Scratch& scratch) { ids[r] = SampleRow(x + r * vocab, vocab, p + r * 5, scratch); });
  return {out};
}

std::vector<std::vector<int64_t>> TopKTopPMinPSamplingInferShape(const std::vector<int64_t>& logits,
                                                                 const std::vector<int64_t>&) {
  return {{logits[0]}};
}

std::vector<paddle::DataType> TopKTopPMinPSamplingInferDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::INT64};
}

PD_BUILD_OP(fd_top_k_top_p_min_p_sampling)
    .Inputs({"Logits", "Params"})
    .Outputs({"Ids"})
    .SetKernelFn(PD_KERNEL(TopKTopPMinPSampling))
    .SetInferShapeFn(PD_INFER_SHAPE(TopKTopPMinPSamplingInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TopKTopPMinPSamplingInferDtype));

// Test-only: how ForEachRow, forced onto the OpenMP team, hands out `rows` rows. rows: [rows] (any
// dtype, its length only). Out: [rows, 3] int64: per row the number of times it was run (1 when
// correct), the OpenMP thread number that ran it last and the team's size. Costs the sampling op
// nothing: it only shares ForEachRow.
std::vector<paddle::Tensor> SamplingRowVisits(const paddle::Tensor& rows_like) {
  const int64_t rows = rows_like.numel();
  auto out = paddle::full({rows, 3}, 0, paddle::DataType::INT64, paddle::CPUPlace());
  int64_t* o = out.data<int64_t>();
  ForEachRow(
      rows, /*parallel=*/true, [] { return 0; },
      [o](int64_t r, int&) {
#ifdef _OPENMP
        const int64_t thread = omp_get_thread_num(), team = omp_get_num_threads();
#else
        const int64_t thread = 0, team = 1;
#endif
#pragma omp atomic
        o[3 * r] += 1;
        o[3 * r + 1] = thread;
        o[3 * r + 2] = team;
      });
  return {out};
}

PD_BUILD_OP(fd_sampling_row_visits)
    .Inputs({"RowsLike"})
    .Outputs({"Visits"})
    .SetKernelFn(PD_KERNEL(SamplingRowVisits));
