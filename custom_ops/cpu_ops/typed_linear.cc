// y = x @ W (+ bias) for a weight in any of the engine's formats, chosen by its type id (the `qtype` of
// fd_decoder_layers and fd_moe_mlp):
//
//   0                      dense float32 W [in, out] (Paddle's orientation): Paddle's matmul
//   2, 3, 8                GGUF Q4_0 / Q4_1 / Q8_0 blocks in gguf_interleave_rows' layout: gguf_linear.cc
//   6, 7, 10, 11, 12,      GGUF Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K blocks row-major as the file
//   13, 14                 stores them (gguf_rows.h): gguf_linear.cc
//                          (every GGUF type: float32 kernels on gguf-py's values, chosen by the rows of x)
//   1100                   GGUF segments of those types (a layer whose parts differ in type): gguf_linear.cc
//   30, 1008, 1004         packed bf16 / wint8 / wint4 (packed_linear.h): packed_linear.cc
//
// x: [n, in] float32; bias: [out] float32, or a zero-size tensor for none; y: [n, out] float32. Packed
// kinds add the bias where they write y (packed_linear.cc); the others add it to the product in place,
// one float32 add per element, as Paddle's `y + bias` in fastdeploy/model_executor/layers/linear.py
// LinearMethod.forward, so a composed op equals the layer path.
//
// GateUpSwiGlu: an MLP's gate_up projection and SwiGLU, silu(gate) * up [n, intermediate]: a packed
// gate_up (stored with gate and up interleaved per panel, layers/quantization/packed.py) in one
// fd_packed_linear call with its SwiGLU activation; the others ([gate | up] columns) as TypedLinear,
// then fd_silu_and_mul. Either way the layer path's arithmetic (layers/mlp.py DenseMLP).
#include "cpu_ops.h"
#include "packed_linear.h"

namespace {
paddle::Tensor Product(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t qtype, int64_t out_features) {
  if (qtype == 0) {
    PD_CHECK(weight.dtype() == paddle::DataType::FLOAT32 && weight.shape().size() == 2,
             "typed linear: a dense weight (qtype 0) must be float32 [in, out]");
    return paddle::experimental::matmul(x, weight, false, false);
  }
  return GgufLinear(x, weight, qtype, out_features)[0];
}
}  // namespace

paddle::Tensor TypedLinear(const paddle::Tensor& x, const paddle::Tensor& weight, const paddle::Tensor& bias,
                           int64_t qtype, int64_t out_features) {
  if (packed::KnownKind(qtype)) return PackedLinear(x, weight, bias, qtype, out_features, false, 0)[0];
  paddle::Tensor y = Product(x, weight, qtype, out_features);
  if (bias.numel() == 0) return y;
  PD_CHECK(bias.dtype() == paddle::DataType::FLOAT32 && bias.numel() == out_features,
           "typed linear: a bias must be float32 [", out_features, "], got ", bias.numel(), " values");
  const int64_t rows = y.numel() / out_features;
  float* out = y.data<float>();
  const float* b = bias.data<float>();
  for (int64_t i = 0; i < rows; ++i) {
#pragma omp simd
    for (int64_t j = 0; j < out_features; ++j) out[i * out_features + j] += b[j];
  }
  return y;
}

paddle::Tensor GateUpSwiGlu(const paddle::Tensor& x, const paddle::Tensor& gate_up, const paddle::Tensor& bias,
                            int64_t qtype, int64_t intermediate) {
  if (packed::KnownKind(qtype)) return PackedLinear(x, gate_up, bias, qtype, intermediate, false, packed::kSwiGlu)[0];
  return SiluAndMul(TypedLinear(x, gate_up, bias, qtype, 2 * intermediate))[0];
}
