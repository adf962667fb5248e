// The bf16 GEMV of gemv.h, compiled once per ISA variant (with that ISA's flags).
// No std:: templates here (several ISA variants may be linked into one binary).
#include "api.h"
#include "gemv.h"
#include "gemv_amx.h"
#include "vec.h"

namespace octavo {
namespace OCTAVO_ISA_NS {

namespace {

constexpr int kMaxRows = 4;  // rows of x per pass over the weight (decode batch sizes)
// 1 KiB ahead in each block's stream (SmolLM2-135M shape, 2 threads, batch 1: the bf16 decoder
// stack 9.5 -> 8.9 ms per token, the lm_head 2.2 -> 2.0 ms)
constexpr int64_t kPrefetchElems = 512;

struct GemvJob {
  const GemvArgs* a;
  int64_t groups_per_item;  // 16-row blocks of W per work item
  int64_t n_blocks;
};

// acc[r][g] += x[r] . W-block g, over all k pairs; then rounded (with bias) into out.
template <int MR, int G>
inline void tile(const GemvArgs& a, int64_t blk0, int64_t r0) {
  const int64_t kp_n = a.k / 2;
  const int64_t bstride = kp_n * 32;  // elements per packed 16-row block
  const uint16_t* w0 = a.w + blk0 * bstride;
  const uint16_t* xr[MR];
  for (int r = 0; r < MR; ++r) xr[r] = a.x + (r0 + r) * a.x_stride;
  F acc[MR][G];
  for (int r = 0; r < MR; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = zero();
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    for (int g = 0; g < G; ++g) {
      __builtin_prefetch(w0 + g * bstride + kp * 32 + kPrefetchElems);
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

template <int MR>
inline void rows_item(const GemvArgs& a, int64_t blk0, int64_t nblk, int64_t r0) {
  int64_t b = blk0;
  for (; b + 4 <= blk0 + nblk; b += 4) tile<MR, 4>(a, b, r0);
  for (; b + 2 <= blk0 + nblk; b += 2) tile<MR, 2>(a, b, r0);
  for (; b < blk0 + nblk; ++b) tile<MR, 1>(a, b, r0);
}

void gemv_item(void* ctx, int64_t item, int) {
  const GemvJob& j = *static_cast<const GemvJob*>(ctx);
  const GemvArgs& a = *j.a;
  const int64_t blk0 = item * j.groups_per_item;
  int64_t nblk = j.n_blocks - blk0;
  if (nblk > j.groups_per_item) nblk = j.groups_per_item;
  for (int64_t r0 = 0; r0 < a.m; r0 += kMaxRows) {
    switch (a.m - r0 >= kMaxRows ? kMaxRows : a.m - r0) {
      case 1: rows_item<1>(a, blk0, nblk, r0); break;
      case 2: rows_item<2>(a, blk0, nblk, r0); break;
      case 3: rows_item<3>(a, blk0, nblk, r0); break;
      default: rows_item<4>(a, blk0, nblk, r0); break;
    }
  }
}

}  // namespace

// Work items of whole 16-row blocks: at least ~8 per thread (dynamic hand-out evens out
// threads that share a core with other work), at most 16 blocks (a 4-block tile x 4).
void gemv_bf16(const GemvArgs& a) {
#if OCTAVO_GEMV_AMX
  if (gemv_amx(a)) return;  // 5+ rows, K % 32 == 0, AMX usable here
#endif
  GemvJob j{&a, 1, a.n / 16};
  const int threads = threading::resolve_threads(a.num_threads);
  while (j.groups_per_item < 16 && j.n_blocks / (j.groups_per_item * 2) >= 8 * (int64_t)threads)
    j.groups_per_item *= 2;
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
