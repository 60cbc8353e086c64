// append_attention_gpu: Paddle op around append_attention_kernel.cuh (see there for the math).
//
// append_attention_gpu(qkv, key_cache, value_cache, slot_mapping, block_tables, cu_seqlens_q,
//                      seq_lens_decoder, num_heads: int, kv_heads: int, scale: float)
//     -> out [num_tokens, num_heads * head_dim]; key_cache and value_cache are written in place
//        (outputs KeyCacheOut / ValueCacheOut alias them).
//   qkv [num_tokens, (num_heads + 2 * kv_heads) * head_dim] float32, float16 or bfloat16, RoPE applied
//   key_cache, value_cache [num_blocks, kv_heads, block_size, head_dim], qkv's dtype; head_dim 64 or 128
//   slot_mapping [num_tokens] int64 (negative: not written)
//   block_tables [batch_size, max_blocks] int32 or int64, -1 padded
//   cu_seqlens_q [batch_size + 1] int32, seq_lens_decoder [batch_size] int32
// All tensors on one GPU; the kernels run on qkv's stream.
#include "paddle/extension.h"

#include "append_attention_kernel.cuh"

namespace {

template <typename PaddleT, typename CudaT, typename BlockIndex>
void Launch(const paddle::Tensor& qkv, paddle::Tensor& key_cache, paddle::Tensor& value_cache,
            const paddle::Tensor& slot_mapping, const paddle::Tensor& block_tables,
            const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder, paddle::Tensor& out,
            const fdgpu::AppendAttentionShape& shape) {
  const cudaError_t err = fdgpu::LaunchAppendAttention<CudaT, BlockIndex>(
      reinterpret_cast<const CudaT*>(qkv.data<PaddleT>()), reinterpret_cast<CudaT*>(key_cache.data<PaddleT>()),
      reinterpret_cast<CudaT*>(value_cache.data<PaddleT>()), slot_mapping.data<int64_t>(),
      block_tables.data<BlockIndex>(), cu_seqlens_q.data<int>(), seq_lens_decoder.data<int>(),
      reinterpret_cast<CudaT*>(out.data<PaddleT>()), shape, qkv.stream());
  PD_CHECK(err == cudaSuccess, "append_attention_gpu: ", cudaGetErrorString(err));
}

template <typename PaddleT, typename CudaT>
void LaunchForTables(const paddle::Tensor& qkv, paddle::Tensor& key_cache, paddle::Tensor& value_cache,
                     const paddle::Tensor& slot_mapping, const paddle::Tensor& block_tables,
                     const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder, paddle::Tensor& out,
                     const fdgpu::AppendAttentionShape& shape) {
  if (block_tables.dtype() == paddle::DataType::INT32) {
    Launch<PaddleT, CudaT, int32_t>(qkv, key_cache, value_cache, slot_mapping, block_tables, cu_seqlens_q,
                                    seq_lens_decoder, out, shape);
  } else {
    Launch<PaddleT, CudaT, int64_t>(qkv, key_cache, value_cache, slot_mapping, block_tables, cu_seqlens_q,
                                    seq_lens_decoder, out, shape);
  }
}

void CheckInputs(const paddle::Tensor& qkv, const paddle::Tensor& key_cache, const paddle::Tensor& value_cache,
                 const paddle::Tensor& slot_mapping, const paddle::Tensor& block_tables,
                 const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& seq_lens_decoder, int num_heads,
                 int kv_heads) {
  PD_CHECK(qkv.is_gpu() && key_cache.is_gpu() && value_cache.is_gpu(), "append_attention_gpu: GPU tensors only");
  PD_CHECK(key_cache.dtype() == qkv.dtype() && value_cache.dtype() == qkv.dtype(),
           "append_attention_gpu: key_cache and value_cache must have qkv's dtype");
  PD_CHECK(key_cache.shape().size() == 4 && key_cache.shape() == value_cache.shape(),
           "append_attention_gpu: caches must be [num_blocks, kv_heads, block_size, head_dim]");
  PD_CHECK(key_cache.shape()[1] == kv_heads, "append_attention_gpu: key_cache has ", key_cache.shape()[1],
           " KV heads, kv_heads is ", kv_heads);
  const int64_t head_dim = key_cache.shape()[3];
  PD_CHECK(head_dim == 64 || head_dim == 128, "append_attention_gpu: head_dim must be 64 or 128, got ", head_dim);
  PD_CHECK(kv_heads > 0 && num_heads % kv_heads == 0 && num_heads / kv_heads <= fdgpu::attention::kRows,
           "append_attention_gpu: num_heads (", num_heads, ") must be a multiple of kv_heads (", kv_heads,
           ") at most ", fdgpu::attention::kRows, " times larger");
  PD_CHECK(qkv.shape().size() == 2 && qkv.shape()[1] == (num_heads + 2 * kv_heads) * head_dim,
           "append_attention_gpu: qkv must be [num_tokens, (num_heads + 2 * kv_heads) * head_dim]");
  PD_CHECK(slot_mapping.dtype() == paddle::DataType::INT64 && slot_mapping.numel() == qkv.shape()[0],
           "append_attention_gpu: slot_mapping must be int64 [num_tokens]");
  PD_CHECK(block_tables.dtype() == paddle::DataType::INT32 || block_tables.dtype() == paddle::DataType::INT64,
           "append_attention_gpu: block_tables must be int32 or int64");
  PD_CHECK(block_tables.shape().size() == 2, "append_attention_gpu: block_tables must be [batch_size, max_blocks]");
  const int64_t batch_size = block_tables.shape()[0];
  PD_CHECK(cu_seqlens_q.dtype() == paddle::DataType::INT32 && cu_seqlens_q.numel() == batch_size + 1,
           "append_attention_gpu: cu_seqlens_q must be int32 [batch_size + 1]");
  PD_CHECK(seq_lens_decoder.dtype() == paddle::DataType::INT32 && seq_lens_decoder.numel() == batch_size,
           "append_attention_gpu: seq_lens_decoder must be int32 [batch_size]");
}

}  // namespace

std::vector<paddle::Tensor> AppendAttentionGpu(const paddle::Tensor& qkv, paddle::Tensor& key_cache,
                                               paddle::Tensor& value_cache, const paddle::Tensor& slot_mapping,
                                               const paddle::Tensor& block_tables, const paddle::Tensor& cu_seqlens_q,
                                               const paddle::Tensor& seq_lens_decoder, int num_heads, int kv_heads,
                                               float scale) {
  CheckInputs(qkv, key_cache, value_cache, slot_mapping, block_tables, cu_seqlens_q, seq_lens_decoder, num_heads,
              kv_heads);
  const auto& cache = key_cache.shape();
  const fdgpu::AppendAttentionShape shape{static_cast<int>(qkv.shape()[0]),
                                          static_cast<int>(block_tables.shape()[0]),
                                          num_heads,
                                          kv_heads,
                                          static_cast<int>(cache[3]),
                                          static_cast<int>(cache[2]),
                                          static_cast<int>(block_tables.shape()[1]),
                                          scale};
  auto out = paddle::empty({qkv.shape()[0], num_heads * cache[3]}, qkv.dtype(), qkv.place());
  switch (qkv.dtype()) {
    case paddle::DataType::FLOAT32:
      LaunchForTables<float, float>(qkv, key_cache, value_cache, slot_mapping, block_tables, cu_seqlens_q,
                                    seq_lens_decoder, out, shape);
      break;
    case paddle::DataType::FLOAT16:
      LaunchForTables<paddle::float16, __half>(qkv, key_cache, value_cache, slot_mapping, block_tables, cu_seqlens_q,
                                               seq_lens_decoder, out, shape);
      break;
    case paddle::DataType::BFLOAT16:
      LaunchForTables<paddle::bfloat16, __nv_bfloat16>(qkv, key_cache, value_cache, slot_mapping, block_tables,
                                                       cu_seqlens_q, seq_lens_decoder, out, shape);
      break;
    default:
      PD_THROW("append_attention_gpu: qkv must be float32, float16 or bfloat16");
  }
  return {out};
}

std::vector<std::vector<int64_t>> AppendAttentionGpuInferShape(
    const std::vector<int64_t>& qkv, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, int num_heads, int kv_heads, float) {
  return {{qkv[0], qkv[1] / (num_heads + 2 * kv_heads) * num_heads}};
}

std::vector<paddle::DataType> AppendAttentionGpuInferDtype(const paddle::DataType& qkv, const paddle::DataType&,
                                                           const paddle::DataType&, const paddle::DataType&,
                                                           const paddle::DataType&, const paddle::DataType&,
                                                           const paddle::DataType&) {
  return {qkv};
}

PD_BUILD_OP(append_attention_gpu)
    .Inputs({"QKV", "KeyCache", "ValueCache", "SlotMapping", "BlockTables", "CuSeqlensQ", "SeqLensDecoder"})
    .Outputs({"Out", "KeyCacheOut", "ValueCacheOut"})
    .Attrs({"num_heads: int", "kv_heads: int", "scale: float"})
    .SetInplaceMap({{"KeyCache", "KeyCacheOut"}, {"ValueCache", "ValueCacheOut"}})
    .SetKernelFn(PD_KERNEL(AppendAttentionGpu))
    .SetInferShapeFn(PD_INFER_SHAPE(AppendAttentionGpuInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AppendAttentionGpuInferDtype));
