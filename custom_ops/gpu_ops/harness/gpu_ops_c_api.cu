// C entry points over the gpu_ops kernels for the ctypes harness (run_gpu_tests.py): the same
// kernel sources the Paddle ops compile, no Paddle. Every pointer is a device pointer; kernels
// run on the legacy default stream; each call returns a cudaError_t (0 = success) from the launch,
// and fd_synchronize() returns the first asynchronous error.
//
// dtype codes: 0 float32, 1 float16, 2 bfloat16.
#include "../append_attention_kernel.cuh"
#include "../padding_kernel.cuh"
#include "../penalty_kernel.cuh"
#include "../sampling_kernel.cuh"
#include "../token_bitmask_kernel.cuh"

namespace {

template <typename T>
int AppendAttentionTyped(const void* qkv, void* key_cache, void* value_cache, const int64_t* slot_mapping,
                         const void* block_tables, int block_tables_int64, const int* cu_seqlens_q,
                         const int* seq_lens_decoder, void* out, const fdgpu::AppendAttentionShape& s) {
  if (block_tables_int64) {
    return fdgpu::LaunchAppendAttention<T, int64_t>(
        static_cast<const T*>(qkv), static_cast<T*>(key_cache), static_cast<T*>(value_cache), slot_mapping,
        static_cast<const int64_t*>(block_tables), cu_seqlens_q, seq_lens_decoder, static_cast<T*>(out), s, 0);
  }
  return fdgpu::LaunchAppendAttention<T, int32_t>(
      static_cast<const T*>(qkv), static_cast<T*>(key_cache), static_cast<T*>(value_cache), slot_mapping,
      static_cast<const int32_t*>(block_tables), cu_seqlens_q, seq_lens_decoder, static_cast<T*>(out), s, 0);
}

}  // namespace

extern "C" {

int fd_append_attention(const void* qkv, void* key_cache, void* value_cache, const int64_t* slot_mapping,
                        const void* block_tables, int block_tables_int64, const int* cu_seqlens_q,
                        const int* seq_lens_decoder, void* out, int dtype, int num_tokens, int batch_size,
                        int num_heads, int kv_heads, int head_dim, int block_size, int max_blocks_per_seq,
                        float scale) {
  const fdgpu::AppendAttentionShape s{num_tokens, batch_size, num_heads, kv_heads,
                                      head_dim,   block_size, max_blocks_per_seq, scale};
  switch (dtype) {
    case 0:
      return AppendAttentionTyped<float>(qkv, key_cache, value_cache, slot_mapping, block_tables, block_tables_int64,
                                         cu_seqlens_q, seq_lens_decoder, out, s);
    case 1:
      return AppendAttentionTyped<__half>(qkv, key_cache, value_cache, slot_mapping, block_tables,
                                          block_tables_int64, cu_seqlens_q, seq_lens_decoder, out, s);
    case 2:
      return AppendAttentionTyped<__nv_bfloat16>(qkv, key_cache, value_cache, slot_mapping, block_tables,
                                                 block_tables_int64, cu_seqlens_q, seq_lens_decoder, out, s);
    default:
      return cudaErrorInvalidValue;
  }
}

int fd_get_padding_offset(const int64_t* input_ids, const int* seq_lens, int batch_size, int max_len, int64_t* ids,
                          int* padding_offset, int* cu_seqlens) {
  return fdgpu::LaunchGetPaddingOffset(input_ids, seq_lens, batch_size, max_len, ids, padding_offset, cu_seqlens, 0);
}

int fd_rebuild_padding(const void* hidden, const int* cu_seqlens, int batch_size, int hidden_size, void* out,
                       int dtype) {
  switch (dtype) {
    case 0:
      return fdgpu::LaunchRebuildPadding(static_cast<const float*>(hidden), cu_seqlens, batch_size, hidden_size,
                                         static_cast<float*>(out), 0);
    case 1:
      return fdgpu::LaunchRebuildPadding(static_cast<const __half*>(hidden), cu_seqlens, batch_size, hidden_size,
                                         static_cast<__half*>(out), 0);
    case 2:
      return fdgpu::LaunchRebuildPadding(static_cast<const __nv_bfloat16*>(hidden), cu_seqlens, batch_size,
                                         hidden_size, static_cast<__nv_bfloat16*>(out), 0);
    default:
      return cudaErrorInvalidValue;
  }
}

int fd_token_penalty(float* logits, int64_t vocab, const int64_t* rows, const int64_t* token_ids,
                     const float* output_counts, int64_t num_entries, const float* repetition, const float* frequency,
                     const float* presence) {
  return fdgpu::LaunchTokenPenalty(logits, vocab, rows, token_ids, output_counts, num_entries, repetition, frequency,
                                   presence, 0);
}

int fd_sample(const float* logits, int num_rows, int vocab, const float* temperature, const int64_t* top_k,
              const float* top_p, const float* min_p, const double* uniforms, float* workspace, int64_t* token_ids) {
  return fdgpu::LaunchSample(logits, num_rows, vocab, temperature, top_k, top_p, min_p, uniforms, workspace,
                             token_ids, 0);
}

int fd_apply_token_bitmask(float* logits, int64_t num_rows, int64_t vocab, const int32_t* bitmask, int64_t num_words,
                           const int64_t* indices, int64_t m) {
  return fdgpu::LaunchApplyTokenBitmask(logits, num_rows, vocab, bitmask, num_words, indices, m, 0);
}

int fd_synchronize() { return cudaDeviceSynchronize(); }

const char* fd_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
