// token_penalty_gpu: Paddle op around penalty_kernel.cuh (repetition / frequency / presence
// penalties, bitwise equal to fastdeploy/model_executor/layers/sample/penalties.py).
//
// token_penalty_gpu(logits [num_rows, vocab] float32, rows [m] int64, token_ids [m] int64,
//                   output_counts [m] float32, repetition [num_rows] float32,
//                   frequency [num_rows] float32, presence [num_rows] float32)
//   logits are penalised in place (output LogitsOut aliases them); the (row, token) pairs must be
//   distinct.
#include "paddle/extension.h"

#include "penalty_kernel.cuh"

void TokenPenaltyGpu(paddle::Tensor& logits, const paddle::Tensor& rows, const paddle::Tensor& token_ids,
                     const paddle::Tensor& output_counts, const paddle::Tensor& repetition,
                     const paddle::Tensor& frequency, const paddle::Tensor& presence) {
  PD_CHECK(logits.is_gpu() && logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2,
           "token_penalty_gpu: logits must be a float32 [num_rows, vocab] GPU tensor");
  const int64_t num_rows = logits.shape()[0], entries = rows.numel();
  PD_CHECK(rows.dtype() == paddle::DataType::INT64 && token_ids.dtype() == paddle::DataType::INT64 &&
               token_ids.numel() == entries,
           "token_penalty_gpu: rows and token_ids must be int64 [m]");
  PD_CHECK(output_counts.dtype() == paddle::DataType::FLOAT32 && output_counts.numel() == entries,
           "token_penalty_gpu: output_counts must be float32 [m]");
  for (const paddle::Tensor* t : {&repetition, &frequency, &presence}) {
    PD_CHECK(t->dtype() == paddle::DataType::FLOAT32 && t->numel() == num_rows,
             "token_penalty_gpu: repetition, frequency and presence must be float32 [num_rows]");
  }
  const cudaError_t err = fdgpu::LaunchTokenPenalty(
      logits.data<float>(), logits.shape()[1], rows.data<int64_t>(), token_ids.data<int64_t>(),
      output_counts.data<float>(), entries, repetition.data<float>(), frequency.data<float>(),
      presence.data<float>(), logits.stream());
  PD_CHECK(err == cudaSuccess, "token_penalty_gpu: ", cudaGetErrorString(err));
}

PD_BUILD_OP(token_penalty_gpu)
    .Inputs({"Logits", "Rows", "TokenIds", "OutputCounts", "Repetition", "Frequency", "Presence"})
    .Outputs({"LogitsOut"})
    .SetInplaceMap({{"Logits", "LogitsOut"}})
    .SetKernelFn(PD_KERNEL(TokenPenaltyGpu));
