// gguf_interleave_rows: GGUF's row-major Q4_0/Q4_1/Q8_0 blocks rearranged, once at load, into the
// layout gguf_linear reads (gguf_blocks.h; gguf_linear.cc's header): rows in groups of 4, per group
// and block column the 4 rows' scales as float32, then their 4 quant runs; the last group padded with
// zero rows.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_blocks.h"
#include "paddle/extension.h"

std::vector<paddle::Tensor> GgufInterleaveRows(const paddle::Tensor& blocks, int64_t qtype) {
  const Format f = FormatOf(qtype);
  CheckWeight(blocks, qtype, f, "gguf_interleave_rows");
  const int64_t N = blocks.shape()[0], row_bytes = blocks.shape()[1], count = row_bytes / f.gguf_bytes;
  PD_CHECK(row_bytes % f.gguf_bytes == 0, "gguf_interleave_rows: rows of ", row_bytes, " bytes are not whole blocks of ",
           f.gguf_bytes);
  const int64_t groups = (N + kGroup - 1) / kGroup;
  auto out = paddle::full({groups, count * f.group_bytes}, 0, paddle::DataType::UINT8, paddle::CPUPlace());
  const uint8_t* src = blocks.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = n % kGroup;
    for (int64_t b = 0; b < count; ++b) {
      const uint8_t* block = src + n * row_bytes + b * f.gguf_bytes;
      uint8_t* column = dst + ((n / kGroup) * count + b) * f.group_bytes;
      const float d = Half(block);
      std::memcpy(column + 4 * r, &d, 4);
      if (qtype == kQ4_1) {
        const float m = Half(block + 2);
        std::memcpy(column + kScaleRun + 4 * r, &m, 4);
      }
      const int64_t header = f.gguf_bytes - f.quant_bytes;  // the block's half d (and m)
      std::memcpy(column + f.scale_bytes + r * f.quant_bytes, block + header, f.quant_bytes);
    }
  }
  return {out};
}

PD_BUILD_OP(gguf_interleave_rows)
    .Inputs({"Blocks"})
    .Outputs({"Out"})
    .Attrs({"qtype: int64_t"})
    .SetKernelFn(PD_KERNEL(GgufInterleaveRows));
