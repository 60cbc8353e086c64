// Packed weight layout of packed_linear.cc's ops (the linear op, the row lookup of a tied embedding).
//
// A weight W [N, K] (HF orientation: N output features, K input features) in bf16, or weight-only int8
// or int4, packed once at load (fastdeploy/model_executor/layers/quantization/packed.py writes it) into
// one uint8 tensor:
//
//   weights: P = ceil(N / 64) panels of 64 output columns (the last padded with zeros); per panel, for
//            every pair of input features (k2 = k / 2), the 64 columns' two values (column-major pairs:
//            lane 2c + t holds W[64p + c, 2 k2 + t]), i.e. the operand order of AVX512-BF16's
//            `vdpbf16ps`, four 16-column registers per k2; for bf16, read at a row stride of 256 bytes,
//            also AMX's B tile (16 pairs x 16 columns at byte offset 64 j for columns 16 j..16 j + 15).
//            bf16: 2 bytes per value. wint8: int8 q, W = q * s[n] (per-channel scale).
//            wint4: per k2 and 16-column register, 16 bytes: byte i holds lane i in its low nibble and
//            lane i + 16 in its high nibble, q in [0, 15]; W = q * d[g, n] + m[g, n], group g = k / 32
//            (asymmetric, as llama.cpp's Q4_1).
//   scales:  float32 after the weights. wint8: [P, 64] (s[n]). wint4: [P, K / 32, 2, 64] (d of the panel's
//            64 columns, then m). bf16: none.
//
// The kernels multiply exactly these bf16 values: bf16 W; int8 q (exact in bf16), the scale applied to the
// float32 sum; int4 round_to_bf16(fma(q, d, m)) (float32 fused multiply-add). x is rounded to bf16 (round to nearest even), products
// are exact in float32 and summed in float32.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "bf16.h"

namespace packed {

constexpr int64_t kPanel = 64;      // output columns per panel
constexpr int64_t kInt4Group = 32;  // input features per wint4 scale and minimum
// kinds: ggml's id for BF16, and two ids of ours outside ggml's range
constexpr int64_t kBf16 = 30, kWint8 = 1008, kWint4 = 1004;
// fd_packed_linear's `activation` on y: none, QuickGELU, SwiGLU (W then holds gate and up interleaved:
// packed_linear.cc)
constexpr int64_t kNoActivation = 0, kQuickGelu = 1, kSwiGlu = 2;

struct Layout {
  int64_t panels, k2, panel_bytes, scale_floats_per_panel;
  int64_t WeightBytes() const { return panels * panel_bytes; }
  int64_t TotalBytes() const { return WeightBytes() + panels * scale_floats_per_panel * 4; }
};

inline bool KnownKind(int64_t kind) { return kind == kBf16 || kind == kWint8 || kind == kWint4; }

inline Layout LayoutOf(int64_t kind, int64_t N, int64_t K) {
  Layout l;
  l.panels = (N + kPanel - 1) / kPanel;
  l.k2 = K / 2;
  const int64_t values = l.k2 * kPanel * 2;
  l.panel_bytes = kind == kBf16 ? values * 2 : kind == kWint8 ? values : values / 2;
  l.scale_floats_per_panel = kind == kWint8 ? kPanel : kind == kWint4 ? K / kInt4Group * 2 * kPanel : 0;
  return l;
}

using fd_cpu::Bf16ToFloat;  // bf16.h
using fd_cpu::RoundToBf16;

// The value the kernels multiply for lane `lane` (2c + t) of pair k2 in panel p, before the wint8 scale.
inline float PackedValue(const uint8_t* w, const Layout& l, int64_t kind, int64_t p, int64_t k2, int64_t lane) {
  const uint8_t* panel = w + p * l.panel_bytes;
  if (kind == kBf16) return Bf16ToFloat(reinterpret_cast<const uint16_t*>(panel)[k2 * 128 + lane]);
  if (kind == kWint8) return static_cast<float>(reinterpret_cast<const int8_t*>(panel)[k2 * 128 + lane]);
  const int64_t reg = lane / 32, i = lane % 32;
  const uint8_t byte = panel[k2 * 64 + reg * 16 + (i % 16)];
  const int q = i < 16 ? (byte & 15) : (byte >> 4);
  const float* dm = reinterpret_cast<const float*>(w + l.WeightBytes()) + p * l.scale_floats_per_panel +
                    (2 * k2 / kInt4Group) * 2 * kPanel;
  const int64_t c = lane / 2;
  return Bf16ToFloat(RoundToBf16(std::fma(static_cast<float>(q), dm[c], dm[kPanel + c])));
}

// wint8's per-column scales of panel p ([64]), or nullptr for the other kinds.
inline const float* ColumnScales(const uint8_t* w, const Layout& l, int64_t kind, int64_t p) {
  if (kind != kWint8) return nullptr;
  return reinterpret_cast<const float*>(w + l.WeightBytes()) + p * kPanel;
}

}  // namespace packed
