// sampling_gpu: Paddle op around sampling_kernel.cuh (see there for the exact rule).
//
// sampling_gpu(logits [num_rows, vocab] float32, temperature [num_rows] float32, top_k [num_rows] int64,
//              top_p [num_rows] float32, min_p [num_rows] float32, uniforms [num_rows] float64)
//     -> token_ids [num_rows] int64
//   temperature <= 0: greedy argmax (ties to the lowest id); top_k <= 0: off; top_p >= 1: off;
//   min_p 0: off; uniforms in [0, 1), one per row (a seeded request brings its own).
//   logits are not modified (penalties are a separate op: token_penalty_gpu).
#include "paddle/extension.h"

#include "sampling_kernel.cuh"

std::vector<paddle::Tensor> SamplingGpu(const paddle::Tensor& logits, const paddle::Tensor& temperature,
                                        const paddle::Tensor& top_k, const paddle::Tensor& top_p,
                                        const paddle::Tensor& min_p, const paddle::Tensor& uniforms) {
  PD_CHECK(logits.is_gpu(), "sampling_gpu: GPU tensors only");
  PD_CHECK(logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2,
           "sampling_gpu: logits must be float32 [num_rows, vocab]");
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  PD_CHECK(vocab > 0 && vocab < INT_MAX, "sampling_gpu: vocab must be in [1, 2^31 - 1), got ", vocab);
  const auto check = [rows](const paddle::Tensor& t, paddle::DataType dtype, const char* what) {
    PD_CHECK(t.is_gpu() && t.dtype() == dtype && t.numel() == rows, "sampling_gpu: ", what, " must be a [",
             rows, "] GPU tensor of the documented dtype");
  };
  check(temperature, paddle::DataType::FLOAT32, "temperature");
  check(top_k, paddle::DataType::INT64, "top_k");
  check(top_p, paddle::DataType::FLOAT32, "top_p");
  check(min_p, paddle::DataType::FLOAT32, "min_p");
  check(uniforms, paddle::DataType::FLOAT64, "uniforms");
  auto workspace = paddle::empty({rows, vocab}, paddle::DataType::FLOAT32, logits.place());
  auto token_ids = paddle::empty({rows}, paddle::DataType::INT64, logits.place());
  const cudaError_t err = fdgpu::LaunchSample(logits.data<float>(), static_cast<int>(rows), static_cast<int>(vocab),
                                              temperature.data<float>(), top_k.data<int64_t>(), top_p.data<float>(),
                                              min_p.data<float>(), uniforms.data<double>(), workspace.data<float>(),
                                              token_ids.data<int64_t>(), logits.stream());
  PD_CHECK(err == cudaSuccess, "sampling_gpu: ", cudaGetErrorString(err));
  return {token_ids};
}

std::vector<std::vector<int64_t>> SamplingGpuInferShape(const std::vector<int64_t>& logits,
                                                        const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                        const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                        const std::vector<int64_t>&) {
  return {{logits[0]}};
}

std::vector<paddle::DataType> SamplingGpuInferDtype(const paddle::DataType&, const paddle::DataType&,
                                                    const paddle::DataType&, const paddle::DataType&,
                                                    const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::INT64};
}

PD_BUILD_OP(sampling_gpu)
    .Inputs({"Logits", "Temperature", "TopK", "TopP", "MinP", "Uniforms"})
    .Outputs({"TokenIds"})
    .SetKernelFn(PD_KERNEL(SamplingGpu))
    .SetInferShapeFn(PD_INFER_SHAPE(SamplingGpuInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SamplingGpuInferDtype));
