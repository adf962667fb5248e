// AMX tile state, shared by the kernels that use the tiles (gemv_amx.h, quant_amx.h, the bf16
// paged attention of kernels_impl.h): the
// process's permission to use them and the LDTILECFG operand. x86-64 Linux only; include at
// file scope (not inside an ISA namespace).
#pragma once

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace octavo {
namespace amx {

// AMX-TILE and AMX-BF16 present and this process allowed to use the tile registers (asked once
// per translation unit; the request is idempotent).
static inline bool tiles_ready() {
  static int state = -1;
  if (state < 0) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 24)) && (d & (1u << 22));
    // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): Linux >= 5.16
    state = cpu && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }
  return state == 1;
}

struct TileConfig {  // the LDTILECFG operand (palette 1)
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0-7 with rows[t] rows of colsb[t] bytes each (0 rows: the tile is not used).
static inline void configure(const uint8_t (&rows)[8], const uint16_t (&colsb)[8]) {
  TileConfig cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = rows[t];
    cfg.colsb[t] = rows[t] ? colsb[t] : 0;
  }
  // the whole 64-byte operand (GCC 12's _tile_loadconfig names only its first 8 bytes)
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

// Tiles 0-7 with rows[t] rows of 64 bytes each (0 rows: the tile is not used).
static inline void configure(const uint8_t (&rows)[8]) {
  const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
  configure(rows, colsb);
}

}  // namespace amx
}  // namespace octavo
#endif
