// gguf_embedding: rows of a GGUF weight [rows, in_features] (as gguf_linear holds it: Q4_0 / Q4_1 / Q8_0
// interleaved, the other types row-major, gguf_linear_rows.h) dequantized at lookup:
//
//   out[i, :] = dequantize(W)[ids[i], :]   ids [n] int64 in [0, rows) -> out [n, in_features] float32
//
// bit for bit gguf-py's `dequantize` values. A token embedding kept as the file's blocks reads its rows
// here (layers/embeddings.py), and a tied lm_head multiplies the same blocks, so the model holds one copy.
#include <cstdint>
#include <vector>

#include "gguf_linear_rows.h"
#include "paddle/extension.h"

std::vector<paddle::Tensor> GgufEmbedding(const paddle::Tensor& ids, const paddle::Tensor& weight, int64_t qtype,
                                          int64_t rows, int64_t in_features) {
  PD_CHECK(ids.is_cpu() && ids.dtype() == paddle::DataType::INT64, "gguf_embedding: ids must be int64 on CPU");
  CheckBlockWeight(weight, qtype, rows, in_features, "gguf_embedding", "");
  const int64_t n = ids.numel();
  auto out = paddle::empty({n, in_features}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const int64_t* id = ids.data<int64_t>();
  const uint8_t* w = weight.data<uint8_t>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    PD_CHECK(id[i] >= 0 && id[i] < rows, "gguf_embedding: id ", id[i], " outside [0, ", rows, ")");
    DequantWeightRow(w, qtype, in_features, id[i], o + i * in_features);
  }
  return {out};
}

PD_BUILD_OP(gguf_embedding)
    .Inputs({"Ids", "Weight"})
    .Outputs({"Out"})
    .Attrs({"qtype: int64_t", "rows: int64_t", "in_features: int64_t"})
    .SetKernelFn(PD_KERNEL(GgufEmbedding));
