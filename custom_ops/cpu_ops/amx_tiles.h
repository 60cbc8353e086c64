// AMX tile state shared by the ops that use AMX-BF16 (packed_linear.cc, vision_attention_bf16.cc,
// append_attention_decode.cc): the kernel's permission and the tile configuration, compiled only where the
// compiler targets AMX-BF16 on Linux (FD_AMX is then defined); and, in every build, Align64 for the
// buffers those ops' tiles and vectors load.
#pragma once
#include <cstdint>

namespace fd_cpu {
// The first 64-byte boundary at or after p (of a buffer allocated 64 bytes longer): tile rows and vector
// loads then never straddle two cache lines.
template <class T>
T* Align64(T* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}
}  // namespace fd_cpu

#if defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define FD_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace fd_amx {

// Linux gives a process the tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA), once per process; false (no AMX from the kernel) means a path without tiles.
inline bool AmxPermitted() {
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return permitted;
}

struct alignas(64) TileConfig {  // the 64-byte operand of ldtilecfg (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// All eight tiles 16 rows x 64 bytes; per thread, before its first tile instruction.
inline void ConfigureTiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  // GCC's _tile_loadconfig tells the compiler it reads only a pointer's worth of the operand: without this
  // the stores above may be dropped once inlined (ldtilecfg then faults on a garbage configuration)
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

}  // namespace fd_amx
#endif
