// apply_token_bitmask_gpu: Paddle op around token_bitmask_kernel.cuh (structured outputs), the GPU
// counterpart of the CPU op fd_apply_token_bitmask_ (custom_ops/cpu_ops/token_bitmask.cc).
//
// apply_token_bitmask_gpu(logits [rows, vocab] float32, bitmask [m, words] int32, indices [m] int64)
//   logits are masked in place (output LogitsOut aliases them): bit t % 32 of bitmask word t / 32
//   set = token t allowed in logits row indices[i]; every other token (those at or past 32 * words
//   too) becomes -inf, allowed logits keep their bits. All three are GPU tensors; indices is copied
//   to the host once to check that each lies in [0, rows) (a sync).
#include "paddle/extension.h"

#include "token_bitmask_kernel.cuh"

void ApplyTokenBitmaskGpu(paddle::Tensor& logits, const paddle::Tensor& bitmask, const paddle::Tensor& indices) {
  PD_CHECK(logits.is_gpu() && bitmask.is_gpu() && indices.is_gpu(), "apply_token_bitmask_gpu: GPU tensors only");
  PD_CHECK(logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2,
           "apply_token_bitmask_gpu: logits must be float32 [rows, vocab]");
  PD_CHECK(bitmask.dtype() == paddle::DataType::INT32 && bitmask.shape().size() == 2,
           "apply_token_bitmask_gpu: bitmask must be int32 [m, words]");
  PD_CHECK(indices.dtype() == paddle::DataType::INT64 && indices.numel() == bitmask.shape()[0],
           "apply_token_bitmask_gpu: indices must be int64 [m], one logits row per bitmask row");
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  const int64_t m = bitmask.shape()[0], num_words = bitmask.shape()[1];
  const auto host_indices = indices.copy_to(paddle::CPUPlace(), true);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t row = host_indices.data<int64_t>()[i];
    PD_CHECK(row >= 0 && row < rows, "apply_token_bitmask_gpu: bitmask row ", i, " names logits row ", row,
             " outside [0, ", rows, ")");
  }
  const cudaError_t err = fdgpu::LaunchApplyTokenBitmask(logits.data<float>(), rows, vocab, bitmask.data<int32_t>(),
                                                         num_words, indices.data<int64_t>(), m, logits.stream());
  PD_CHECK(err == cudaSuccess, "apply_token_bitmask_gpu: ", cudaGetErrorString(err));
}

PD_BUILD_OP(apply_token_bitmask_gpu)
    .Inputs({"Logits", "Bitmask", "Indices"})
    .Outputs({"LogitsOut"})
    .SetInplaceMap({{"Logits", "LogitsOut"}})
    .SetKernelFn(PD_KERNEL(ApplyTokenBitmaskGpu));
