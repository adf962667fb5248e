// The bf16 GEMV of gemv.h, compiled once per ISA variant (with that ISA's flags).
// No std:: templates here (several ISA variants may be linked into one binary).
#include "api.h"
#include "gemv.h"
#include "gemv_amx.h"
#include "vec.h"

namespace octavo {
namespace OCTAVO_ISA_NS {

namespace {

// Rows of x per register tile: 6 x 4 blocks = 24 accumulators where VDPBF16PS does the
// products (32 vector registers, nothing else live); 4 elsewhere (AVX2 has 16 registers, the
// emulated dot needs temporaries). Each row's sums are the same whatever the tile's rows.
constexpr int kMaxRows = kHasBf16Dot ? 6 : 4;
// 1 KiB ahead in each block's stream (SmolLM2-135M shape, 2 threads, batch 1: the bf16 decoder
// stack 9.5 -> 8.9 ms per token, the lm_head 2.2 -> 2.0 ms)
constexpr int64_t kPrefetchElems = 512;
constexpr int64_t kLineElems = 32;  // bf16 values per 64-byte line

struct GemvJob {
  const GemvArgs* a;
  int64_t groups_per_item;  // 16-row blocks of W per work item
  int64_t n_blocks;
};

// Lines of the next block group to prefetch during one pass over the current group: n lines
// from w, per_kp of them at each k pair until done.
struct NextPanel {
  const uint16_t* w;
  int64_t n, per_kp;
};

// acc[r][g] += x[r] . W-block g, over all k pairs; then rounded (with bias) into out. SPF: the
// first pass over these blocks, which streams them from memory (later passes find them in L2).
template <int MR, int G, bool SPF>
inline void tile(const GemvArgs& a, int64_t blk0, int64_t r0, NextPanel pf) {
  const int64_t kp_n = a.k / 2;
  const int64_t bstride = kp_n * 32;  // elements per packed 16-row block
  const uint16_t* w0 = a.w + blk0 * bstride;
  const uint16_t* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (r0 + r) * a.x_stride;
  F acc[MR][G];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = zero();
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    for (int64_t j = kp * pf.per_kp; j < (kp + 1) * pf.per_kp && j < pf.n; ++j)
      __builtin_prefetch(pf.w + j * kLineElems, 0, 2);
    for (int g = 0; g < G; ++g) {
      if constexpr (SPF) __builtin_prefetch(w0 + g * bstride + kp * 32 + kPrefetchElems);
      const R w = load_raw(w0 + g * bstride + kp * 32);
      for (int r = 0; r < MR; ++r) {
        uint32_t pair;  // x[2kp] in the low half, x[2kp + 1] in the high half
        __builtin_memcpy(&pair, xr[r] + 2 * kp, 4);
        acc[r][g] = dot_bf16_pair(acc[r][g], w, pair);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    const int64_t n0 = (blk0 + g) * 16;
    const F b = a.bias ? load_bf16(a.bias + n0) : zero();
    for (int r = 0; r < MR; ++r) store_bf16(a.out + (r0 + r) * a.o_stride + n0, add(acc[r][g], b));
  }
}

// One pass of up to kMaxRows rows from row r0 over blocks [b, b + G).
template <int G, bool SPF>
inline void pass(const GemvArgs& a, int64_t b, int64_t r0, NextPanel pf) {
  switch (a.m - r0 >= kMaxRows ? kMaxRows : a.m - r0) {
    case 1: tile<1, G, SPF>(a, b, r0, pf); break;
    case 2: tile<2, G, SPF>(a, b, r0, pf); break;
    case 3: tile<3, G, SPF>(a, b, r0, pf); break;
    case 4: tile<4, G, SPF>(a, b, r0, pf); break;
    case 5: if constexpr (kMaxRows > 5) tile<5, G, SPF>(a, b, r0, pf); break;
    default: if constexpr (kMaxRows > 5) tile<kMaxRows, G, SPF>(a, b, r0, pf); break;
  }
}

// Every row over blocks [b, b + G), kMaxRows rows per pass; meanwhile the lines of the next
// next_g blocks are prefetched, spread over the passes, so that the next group's first pass
// finds them in cache instead of waiting on memory with only a few rows' arithmetic to do.
template <int G>
inline void group(const GemvArgs& a, int64_t b, int next_g) {
  const int64_t kp_n = a.k / 2, passes = (a.m + kMaxRows - 1) / kMaxRows;
  const int64_t lines = passes > 1 ? next_g * kp_n : 0;  // a block is kp_n lines
  const int64_t per_pass = (lines + passes - 1) / passes;
  const int64_t per_kp = (per_pass + kp_n - 1) / kp_n;
  const uint16_t* nw = a.w + (b + G) * kp_n * 32;
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t lo = p * per_pass, hi = lo + per_pass < lines ? lo + per_pass : lines;
    const NextPanel pf{nw + lo * kLineElems, hi > lo ? hi - lo : 0, per_kp};
    if (p == 0) pass<G, true>(a, b, 0, pf);
    else pass<G, false>(a, b, p * kMaxRows, pf);
  }
}

inline int64_t group_size(int64_t left) { return left >= 4 ? 4 : left >= 2 ? 2 : left; }

void gemv_item(void* ctx, int64_t item, int) {
  const GemvJob& j = *static_cast<const GemvJob*>(ctx);
  const GemvArgs& a = *j.a;
  const int64_t blk0 = item * j.groups_per_item;
  int64_t nblk = j.n_blocks - blk0;
  if (nblk > j.groups_per_item) nblk = j.groups_per_item;
  const int64_t end = blk0 + nblk;
  for (int64_t b = blk0; b < end;) {
    const int64_t g = group_size(end - b), next = group_size(end - b - g);
    if (g == 4) group<4>(a, b, (int)next);
    else if (g == 2) group<2>(a, b, (int)next);
    else group<1>(a, b, (int)next);
    b += g;
  }
}

}  // namespace

// Work items of whole 16-row blocks. One pass over the rows (decode at a few rows): at least ~8
// items per thread (dynamic hand-out evens out threads that share a core with other work), at
// most 16 blocks (a 4-block tile x 4). Several passes: one contiguous run per thread, so that
// every group but a run's first has its weight lines prefetched during the group before it
// (the weights of a step do not stay in cache between steps: SmolLM2-135M's linears, 30 layers
// + LM head from DRAM, 2-core Zen 4, per step: 8 rows 13.1-13.7 -> 11.0 ms, 32 rows 31.9 ->
// 26.4 ms, 48 rows 36.8-38.9 -> 36.5-37.5 ms).
void gemv_bf16(const GemvArgs& a) {
#if OCTAVO_GEMV_AMX
  if (gemv_amx(a)) return;  // 5+ rows, K % 32 == 0, AMX usable here
#endif
  GemvJob j{&a, 1, a.n / 16};
  const int threads = threading::resolve_threads(a.num_threads);
  while (j.groups_per_item < 16 && j.n_blocks / (j.groups_per_item * 2) >= 8 * (int64_t)threads)
    j.groups_per_item *= 2;
  if (a.m > kMaxRows)  // several passes: one run of whole 4-block groups per thread
    j.groups_per_item = ((j.n_blocks + threads - 1) / threads + 3) / 4 * 4;
  const int64_t items = (j.n_blocks + j.groups_per_item - 1) / j.groups_per_item;
  threading::parallel_run(items, threads, &gemv_item, &j);
}

bool gemv_amx_supported() {
#if OCTAVO_GEMV_AMX
  return amx::tiles_ready();
#else
  return false;
#endif
}

}  // namespace OCTAVO_ISA_NS
}  // namespace octavo
