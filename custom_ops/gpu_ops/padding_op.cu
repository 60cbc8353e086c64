// get_padding_offset_gpu and rebuild_padding_gpu: Paddle ops around padding_kernel.cuh (FastDeploy's
// get_padding_offset / rebuild_padding, simplified to the ragged layout this engine uses).
//
// get_padding_offset_gpu(input_ids [batch_size, max_len] int64, seq_lens [batch_size] int32)
//     -> ids [num_tokens] int64, padding_offset [num_tokens] int32, cu_seqlens_q [batch_size + 1] int32
//   num_tokens = sum(seq_lens): seq_lens is copied to the host once to size the outputs (a sync),
//   and each length must lie in [0, max_len].
// rebuild_padding_gpu(hidden [num_tokens, hidden_size] float32/float16/bfloat16,
//                     cu_seqlens_q [batch_size + 1] int32)
//     -> out [batch_size, hidden_size]: each request's last token (zeros for an empty request).
#include "paddle/extension.h"

#include "padding_kernel.cuh"

std::vector<paddle::Tensor> GetPaddingOffsetGpu(const paddle::Tensor& input_ids, const paddle::Tensor& seq_lens) {
  PD_CHECK(input_ids.is_gpu() && seq_lens.is_gpu(), "get_padding_offset_gpu: GPU tensors only");
  PD_CHECK(input_ids.dtype() == paddle::DataType::INT64 && input_ids.shape().size() == 2,
           "get_padding_offset_gpu: input_ids must be int64 [batch_size, max_len]");
  const int64_t batch_size = input_ids.shape()[0], max_len = input_ids.shape()[1];
  PD_CHECK(seq_lens.dtype() == paddle::DataType::INT32 && seq_lens.numel() == batch_size,
           "get_padding_offset_gpu: seq_lens must be int32 [batch_size]");
  const auto host_lens = seq_lens.copy_to(paddle::CPUPlace(), true);
  int64_t num_tokens = 0;
  for (int64_t i = 0; i < batch_size; ++i) {
    const int len = host_lens.data<int>()[i];
    PD_CHECK(len >= 0 && len <= max_len, "get_padding_offset_gpu: seq_lens[", i, "] = ", len,
             " is outside [0, max_len = ", max_len, "]");
    num_tokens += len;
  }
  auto ids = paddle::empty({num_tokens}, paddle::DataType::INT64, input_ids.place());
  auto padding_offset = paddle::empty({num_tokens}, paddle::DataType::INT32, input_ids.place());
  auto cu_seqlens = paddle::empty({batch_size + 1}, paddle::DataType::INT32, input_ids.place());
  const cudaError_t err = fdgpu::LaunchGetPaddingOffset(
      input_ids.data<int64_t>(), seq_lens.data<int>(), static_cast<int>(batch_size), static_cast<int>(max_len),
      ids.data<int64_t>(), padding_offset.data<int>(), cu_seqlens.data<int>(), input_ids.stream());
  PD_CHECK(err == cudaSuccess, "get_padding_offset_gpu: ", cudaGetErrorString(err));
  return {ids, padding_offset, cu_seqlens};
}

std::vector<std::vector<int64_t>> GetPaddingOffsetGpuInferShape(const std::vector<int64_t>& input_ids,
                                                                const std::vector<int64_t>&) {
  return {{-1}, {-1}, {input_ids[0] + 1}};
}

std::vector<paddle::DataType> GetPaddingOffsetGpuInferDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::INT64, paddle::DataType::INT32, paddle::DataType::INT32};
}

PD_BUILD_OP(get_padding_offset_gpu)
    .Inputs({"InputIds", "SeqLens"})
    .Outputs({"Ids", "PaddingOffset", "CuSeqlensQ"})
    .SetKernelFn(PD_KERNEL(GetPaddingOffsetGpu))
    .SetInferShapeFn(PD_INFER_SHAPE(GetPaddingOffsetGpuInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GetPaddingOffsetGpuInferDtype));

namespace {
template <typename PaddleT, typename CudaT>
void RebuildPaddingLaunch(const paddle::Tensor& hidden, const paddle::Tensor& cu_seqlens_q, paddle::Tensor& out) {
  const cudaError_t err = fdgpu::LaunchRebuildPadding<CudaT>(
      reinterpret_cast<const CudaT*>(hidden.data<PaddleT>()), cu_seqlens_q.data<int>(),
      static_cast<int>(out.shape()[0]), static_cast<int>(out.shape()[1]), reinterpret_cast<CudaT*>(out.data<PaddleT>()),
      hidden.stream());
  PD_CHECK(err == cudaSuccess, "rebuild_padding_gpu: ", cudaGetErrorString(err));
}
}  // namespace

std::vector<paddle::Tensor> RebuildPaddingGpu(const paddle::Tensor& hidden, const paddle::Tensor& cu_seqlens_q) {
  PD_CHECK(hidden.is_gpu() && cu_seqlens_q.is_gpu(), "rebuild_padding_gpu: GPU tensors only");
  PD_CHECK(hidden.shape().size() == 2, "rebuild_padding_gpu: hidden must be [num_tokens, hidden_size]");
  PD_CHECK(cu_seqlens_q.dtype() == paddle::DataType::INT32 && cu_seqlens_q.numel() >= 1,
           "rebuild_padding_gpu: cu_seqlens_q must be int32 [batch_size + 1]");
  auto out = paddle::empty({cu_seqlens_q.numel() - 1, hidden.shape()[1]}, hidden.dtype(), hidden.place());
  switch (hidden.dtype()) {
    case paddle::DataType::FLOAT32:
      RebuildPaddingLaunch<float, float>(hidden, cu_seqlens_q, out);
      break;
    case paddle::DataType::FLOAT16:
      RebuildPaddingLaunch<paddle::float16, __half>(hidden, cu_seqlens_q, out);
      break;
    case paddle::DataType::BFLOAT16:
      RebuildPaddingLaunch<paddle::bfloat16, __nv_bfloat16>(hidden, cu_seqlens_q, out);
      break;
    default:
      PD_THROW("rebuild_padding_gpu: hidden must be float32, float16 or bfloat16");
  }
  return {out};
}

std::vector<std::vector<int64_t>> RebuildPaddingGpuInferShape(const std::vector<int64_t>& hidden,
                                                              const std::vector<int64_t>& cu_seqlens_q) {
  return {{cu_seqlens_q[0] - 1, hidden[1]}};
}

std::vector<paddle::DataType> RebuildPaddingGpuInferDtype(const paddle::DataType& hidden, const paddle::DataType&) {
  return {hidden};
}

PD_BUILD_OP(rebuild_padding_gpu)
    .Inputs({"Hidden", "CuSeqlensQ"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(RebuildPaddingGpu))
    .SetInferShapeFn(PD_INFER_SHAPE(RebuildPaddingGpuInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RebuildPaddingGpuInferDtype));
