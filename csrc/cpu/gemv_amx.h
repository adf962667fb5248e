// bf16 skinny GEMM on AMX over the GEMV's packed weight (gemv.h), for decode batches of
// kGemvAmxMinRows rows and more. Included by gemv.cpp (after its ISA flags are set); compiled only into the AVX512-BF16 variant on x86-64 Linux (OCTAVO_GEMV_AMX), used only where
// CPUID reports AMX-TILE and AMX-BF16 and the kernel grants this process the tile state.
//
// The packed layout [N/16][K/2][16][2] is AMX's B-tile layout already: for a block of 16 output
// rows, 16 consecutive k pairs are 16 rows of 64 bytes (16 outputs x a bf16 pair), contiguous.
// So the weight is read straight into tiles, once per call for up to 32 rows of x (a block of
// 32 more rows re-reads that block's weights from L2). Per work item (runs of two 16-output
// blocks, handed out dynamically) and block of 32 rows: four 16x16 fp32 accumulator tiles
// (TDPBF16PS, 32 k per step); then + bias and one rounding to bf16, as the GEMV does. oneDNN's
// blocked GEMM, which the layers used at these sizes, streamed the weights at about half the
// memory bandwidth on a 2-core Xeon.
#pragma once

#if defined(OCTAVO_ISA_AVX512) && defined(__AVX512BF16__) && defined(__x86_64__) && defined(__linux__)
#define OCTAVO_GEMV_AMX 1
#include "amx.h"
#else
#define OCTAVO_GEMV_AMX 0
#endif

#include "api.h"
#include "gemv.h"
#include "vec.h"

#if OCTAVO_GEMV_AMX
namespace octavo {
namespace OCTAVO_ISA_NS {

constexpr int64_t kGemvAmxMinRows = 2;  // below this the register GEMV is faster
#define OCTAVO_GEMV_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

// tiles: 0 C(rows 0-15, block 0), 1 C(rows 0-15, block 1), 2 C(rows 16-31, block 0),
// 3 C(rows 16-31, block 1), 4 A(rows 0-15), 5 A(rows 16-31), 6 B(block 0), 7 B(block 1)
static void gemv_amx_configure(int r0, int r1) {
  const uint8_t rows[8] = {(uint8_t)r0, (uint8_t)r0, (uint8_t)r1, (uint8_t)r1, (uint8_t)r0, (uint8_t)r1, 16, 16};
  amx::configure(rows);
}

struct GemvAmxJob {
  const GemvArgs* a;
  int64_t blocks_per_item;  // 16-output blocks, even
  int64_t n_blocks;
};

// out rows [m0, m0 + r0 + r1) x blocks [blk, blk + nb) (nb 1 or 2): the four tiles' sums + bias
OCTAVO_GEMV_AMX_TARGET static void gemv_amx_store(const GemvArgs& a, const float* c, int64_t m0, int rows,
                                                  int64_t blk, int nb) {
  for (int i = 0; i < rows; ++i) {
    const float* ci = c + (i < 16 ? i * 16 : (32 + i - 16) * 16);  // tiles 0/1 rows, then 2/3
    uint16_t* o = a.out + (m0 + i) * a.o_stride + blk * 16;
    for (int j = 0; j < nb; ++j) {
      const F b = a.bias ? load_bf16(a.bias + (blk + j) * 16) : zero();
      store_bf16(o + j * 16, add(load(ci + j * 256), b));
    }
  }
}

OCTAVO_GEMV_AMX_TARGET static void gemv_amx_item(void* ctx, int64_t item, int) {
  const GemvAmxJob& j = *(const GemvAmxJob*)ctx;
  const GemvArgs& a = *j.a;
  const int64_t b0 = item * j.blocks_per_item;
  const int64_t b1 = b0 + j.blocks_per_item < j.n_blocks ? b0 + j.blocks_per_item : j.n_blocks;
  const int64_t bstride = a.k * 16;  // bf16 elements per packed 16-output block
  const int64_t steps = a.k / 32, xsb = a.x_stride * 2;
  alignas(64) float c[4 * 256];  // the four accumulator tiles, 16 x 16 fp32 each
  int configured = -1;
  for (int64_t m0 = 0; m0 < a.m; m0 += 32) {
    const int mb = a.m - m0 < 32 ? (int)(a.m - m0) : 32, r0 = mb < 16 ? mb : 16, r1 = mb - r0;
    if (mb != configured) { gemv_amx_configure(r0, r1); configured = mb; }
    const uint16_t* x0 = a.x + m0 * a.x_stride;
    const uint16_t* x1 = x0 + 16 * a.x_stride;
    for (int64_t blk = b0; blk < b1; blk += 2) {
      const int nb = b1 - blk >= 2 ? 2 : 1;
      const uint16_t* w0 = a.w + blk * bstride;
      const uint16_t* w1 = w0 + bstride;
      _tile_zero(0); _tile_zero(1);
      if (r1) { _tile_zero(2); _tile_zero(3); }
      for (int64_t s = 0; s < steps; ++s) {
        _tile_loadd(4, x0 + s * 32, xsb);
        _tile_loadd(6, w0 + s * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (nb == 2) { _tile_loadd(7, w1 + s * 512, 64); _tile_dpbf16ps(1, 4, 7); }
        if (r1) {
          _tile_loadd(5, x1 + s * 32, xsb);
          _tile_dpbf16ps(2, 5, 6);
          if (nb == 2) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c, 64); _tile_stored(1, c + 256, 64);
      if (r1) { _tile_stored(2, c + 512, 64); _tile_stored(3, c + 768, 64); }
      gemv_amx_store(a, c, m0, mb, blk, nb);
    }
  }
  _tile_release();
}

// The AMX path for ``a`` if it applies here (rows, K a multiple of 32, AMX usable): true when done.
static bool gemv_amx(const GemvArgs& a) {
  if (a.m < kGemvAmxMinRows || a.k % 32 || !amx::tiles_ready()) return false;
  GemvAmxJob j{&a, 2, a.n / 16};
  const int threads = threading::resolve_threads(a.num_threads);
  while (j.blocks_per_item < 16 && j.n_blocks / (j.blocks_per_item * 2) >= 4 * (int64_t)threads)
    j.blocks_per_item *= 2;
  const int64_t items = (j.n_blocks + j.blocks_per_item - 1) / j.blocks_per_item;
  threading::parallel_run(items, items > 1 ? threads : 1, &gemv_amx_item, &j);
  return true;
}

}  // namespace OCTAVO_ISA_NS
}  // namespace octavo
#endif  // OCTAVO_GEMV_AMX
