// Log-probabilities of chosen tokens and the top-k alternatives, from float32 logits rows.
//
// Reference: compute_logprobs in fastdeploy/model_executor/layers/sample/logprobs.py (numpy):
//   logprob = l_t - logsumexp(l) (natural log; the sum in float64 of float32 exp(l - max));
//   rank = 1 + the number of tokens with a strictly larger logit;
//   top-k: the k largest logits, larger first, ties by lower id (-inf entries when k exceeds the
//   finite ones), found by one scan with a rising threshold, not a sort of the vocabulary.
// Rows run one after another: a step holds few rows, each 2 passes over its logits (3 with top-k).
//
// logits:    [m, vocab] float32, not modified
// token_ids: [m] int64, the chosen (or actual) token of each row
// k:         attribute, 0 <= k <= vocab
// outputs:   top_ids [m, k] int64, top_logprobs [m, k] float32, top_ranks [m, k] int64,
//            token_logprobs [m] float32, token_ranks [m] int64
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "paddle/extension.h"
#include "sampling_common.h"

namespace {
using fd_sampling::Before;
using fd_sampling::Candidate;
using fd_sampling::ExpNonPositive;
using fd_sampling::GatherTopK;
using fd_sampling::RowMax;

struct RowSums {
  double log_sum_exp;  // log(sum(exp(x))) = max + log(sum(exp(x - max))), the sum in float64
  int64_t above;       // entries strictly larger than the chosen token's
};

RowSums SumRow(const float* x, int64_t n, float chosen) {
  const float top = RowMax(x, n);
  double sum = 0.0;
  int64_t above = 0;
#pragma omp simd reduction(+ : sum, above)
  for (int64_t i = 0; i < n; ++i) {
    sum += ExpNonPositive(x[i] - top);
    above += x[i] > chosen;
  }
  return {top + std::log(sum), above};
}

struct RowOut {
  int64_t* top_ids;
  float* top_logprobs;
  int64_t* top_ranks;
  float* token_logprob;
  int64_t* token_rank;
};

void RowLogprobs(const float* x, int64_t vocab, int64_t token, int64_t k, std::vector<Candidate>& top,
                 const RowOut& out) {
  const RowSums sums = SumRow(x, vocab, x[token]);
  const double lse = sums.log_sum_exp;
  *out.token_logprob = static_cast<float>(x[token] - lse);
  *out.token_rank = 1 + sums.above;
  if (k == 0) return;
  GatherTopK(x, vocab, k, /*positive_only=*/false, top);
  std::sort(top.begin(), top.end(), Before);
  for (int64_t j = 0; j < k; ++j) {
    out.top_ids[j] = top[j].id;
    out.top_logprobs[j] = static_cast<float>(top[j].value - lse);
    // every token above top[j] is listed before it: its rank is where its value first appears
    out.top_ranks[j] = j > 0 && top[j].value == top[j - 1].value ? out.top_ranks[j - 1] : j + 1;
  }
}
}  // namespace

std::vector<paddle::Tensor> TokenLogprobs(const paddle::Tensor& logits, const paddle::Tensor& token_ids, int64_t k) {
  PD_CHECK(logits.is_cpu() && token_ids.is_cpu(), "fd_token_logprobs runs on CPU tensors");
  PD_CHECK(logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2,
           "logits must be float32 [m, vocab]");
  const int64_t m = logits.shape()[0], vocab = logits.shape()[1];
  PD_CHECK(token_ids.dtype() == paddle::DataType::INT64 && token_ids.numel() == m, "token_ids must be int64 [m]");
  PD_CHECK(vocab > 0 && vocab <= INT32_MAX, "vocab must be in [1, 2^31)");
  PD_CHECK(k >= 0 && k <= vocab, "k must be in [0, vocab], got ", k);
  const float* x = logits.data<float>();
  const int64_t* ids = token_ids.data<int64_t>();
  for (int64_t r = 0; r < m; ++r)
    PD_CHECK(ids[r] >= 0 && ids[r] < vocab, "token id ", ids[r], " of row ", r, " outside [0, ", vocab, ")");
  auto top_ids = paddle::empty({m, k}, paddle::DataType::INT64, paddle::CPUPlace());
  auto top_logprobs = paddle::empty({m, k}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto top_ranks = paddle::empty({m, k}, paddle::DataType::INT64, paddle::CPUPlace());
  auto token_logprobs = paddle::empty({m}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto token_ranks = paddle::empty({m}, paddle::DataType::INT64, paddle::CPUPlace());
  std::vector<Candidate> top;
  for (int64_t r = 0; r < m; ++r) {
    const RowOut out{top_ids.data<int64_t>() + r * k, top_logprobs.data<float>() + r * k,
                     top_ranks.data<int64_t>() + r * k, token_logprobs.data<float>() + r,
                     token_ranks.data<int64_t>() + r};
    RowLogprobs(x + r * vocab, vocab, ids[r], k, top, out);
  }
  return {top_ids, top_logprobs, top_ranks, token_logprobs, token_ranks};
}

std::vector<std::vector<int64_t>> TokenLogprobsInferShape(const std::vector<int64_t>& logits,
                                                          const std::vector<int64_t>&, int64_t k) {
  return {{logits[0], k}, {logits[0], k}, {logits[0], k}, {logits[0]}, {logits[0]}};
}

std::vector<paddle::DataType> TokenLogprobsInferDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::INT64, paddle::DataType::FLOAT32, paddle::DataType::INT64, paddle::DataType::FLOAT32,
          paddle::DataType::INT64};
}

PD_BUILD_OP(fd_token_logprobs)
    .Inputs({"Logits", "TokenIds"})
    .Outputs({"TopIds", "TopLogprobs", "TopRanks", "TokenLogprobs", "TokenRanks"})
    .Attrs({"k: int64_t"})
    .SetKernelFn(PD_KERNEL(TokenLogprobs))
    .SetInferShapeFn(PD_INFER_SHAPE(TokenLogprobsInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TokenLogprobsInferDtype));
