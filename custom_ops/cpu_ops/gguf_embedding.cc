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
  PD_CHECK(weight.is_cpu() && weight.dtype() == paddle::DataType::UINT8 && weight.shape().size() == 2,
           "gguf_embedding: weight must be 2-D uint8 on CPU");
  const RowFormat rf = RowFormatOf(qtype);
  const Format f = FormatOf(qtype);
  PD_CHECK(rf.values > 0 || f.group_bytes > 0, "gguf_embedding: unsupported GGUF type id ", qtype);
  const int64_t values = rf.values > 0 ? rf.values : kBlock;
  const int64_t weight_rows = rf.values > 0 ? rows : (rows + kGroup - 1) / kGroup;
  const int64_t row_bytes = rf.values > 0 ? in_features / values * rf.bytes : in_features / values * f.group_bytes;
  PD_CHECK(in_features % values == 0 && weight.shape()[0] == weight_rows && weight.shape()[1] == row_bytes,
           "gguf_embedding: weight [", weight.shape()[0], ", ", weight.shape()[1], "] does not hold ", rows,
           " rows of ", in_features, " weights of type ", qtype);
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
