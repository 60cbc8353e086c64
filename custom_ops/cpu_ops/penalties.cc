// Repetition, frequency and presence penalties on a batch of float32 logits, in place and sparse: only
// the (row, token) pairs listed are touched. Reference: apply_penalties in
// fastdeploy/model_executor/layers/sample/penalties.py (FastDeploy's get_token_penalty_multi_scores):
//   l = l / repetition[r] if l > 0 else l * repetition[r]
//   l = l - frequency[r] * count - presence[r] * [count > 0]
//
// logits:  [rows, vocab] float32, updated in place
// entries: [m, 2] int64 (row, token id), each pair at most once (a repeated pair is penalised twice)
// counts:  [m] float32 occurrences of the token in the row's output (0: seen in the prompt only)
// params:  [rows, 3] float32 (repetition, frequency, presence) of each row
#include <cstdint>
#include <vector>

#include "paddle/extension.h"

void ApplyPenalties(paddle::Tensor& logits, const paddle::Tensor& entries, const paddle::Tensor& counts,
                    const paddle::Tensor& params) {
  PD_CHECK(logits.is_cpu() && entries.is_cpu() && counts.is_cpu() && params.is_cpu(),
           "fd_apply_penalties_ runs on CPU tensors");
  PD_CHECK(logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2,
           "logits must be float32 [rows, vocab]");
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  PD_CHECK(entries.dtype() == paddle::DataType::INT64 && entries.shape().size() == 2 && entries.shape()[1] == 2,
           "entries must be int64 [m, 2] (row, token id)");
  const int64_t m = entries.shape()[0];
  PD_CHECK(counts.dtype() == paddle::DataType::FLOAT32 && counts.numel() == m, "counts must be float32 [m]");
  PD_CHECK(params.dtype() == paddle::DataType::FLOAT32 && params.shape().size() == 2 && params.shape()[0] == rows &&
               params.shape()[1] == 3,
           "params must be float32 [rows, 3] (repetition, frequency, presence)");
  float* x = logits.data<float>();
  const int64_t* e = entries.data<int64_t>();
  const float* c = counts.data<float>();
  const float* p = params.data<float>();
  for (int64_t j = 0; j < m; ++j) {
    const int64_t r = e[2 * j], t = e[2 * j + 1];
    PD_CHECK(r >= 0 && r < rows && t >= 0 && t < vocab, "penalty entry (", r, ", ", t, ") outside logits [", rows,
             ", ", vocab, "]");
    const float repetition = p[3 * r], frequency = p[3 * r + 1], presence = p[3 * r + 2];
    float v = x[r * vocab + t];
    v = v > 0.0f ? v / repetition : v * repetition;
    x[r * vocab + t] = v - (frequency * c[j] + presence * (c[j] > 0.0f ? 1.0f : 0.0f));
  }
}

PD_BUILD_OP(fd_apply_penalties_)
    .Inputs({"Logits", "Entries", "Counts", "Params"})
    .Outputs({"LogitsOut"})
    .SetInplaceMap({{"Logits", "LogitsOut"}})
    .SetKernelFn(PD_KERNEL(ApplyPenalties));
