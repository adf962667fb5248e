// The one source of the weight-only INT8 / INT4 linear kernels (layout: quant_api.h).
// quant_kernels.cpp includes it once per ISA, after that ISA's vector header, inside
// namespace octavo::OCTAVO_ISA_NS::quant. Written against the logical 16-float vector F; the only
// ISA-specific code is the code -> float decode below (16 uint8 codes, or 16 bytes of nibbles).
//
// Batch 1 (GEMV, memory-bound): per 32-channel tile, fp32 accumulators per scale group hold
//   a = sum_k q[n, k] x[k]; at the group's end y += s * (a - z * sum_k x[k]) (the activation's
//   group sums are computed once per call). Per 16 weights: one widen, one convert, one FMA;
//   even and odd k accumulate separately (latency hiding); kGemvTiles tiles are read side by
//   side (several memory streams per core).
// Batch > 1 (GEMM): per tile and block of kMR rows, each weight vector is dequantized once,
//   w = (q - z) * s exactly as the reference does, and reused by every row of the block.
// Work items are runs of whole tiles (contiguous weights), handed out dynamically.
// Batches of >= 5 bf16 rows on a CPU with AMX: quant_amx.h; without AMX, bf16 batches of at
// least IntLinearArgs::dp_min_rows rows in the avx512_bf16 build: quant_dpbf16.h.
// No std:: templates (several ISA variants may share one binary).
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "quant_api.h"
#include "scalar_convert.h"

// bf16 pair tiles and their VDPBF16PS kernel (quant_pairs.h, quant_dpbf16.h): the AVX512-BF16 build
#if defined(OCTAVO_ISA_AVX512) && defined(__AVX512BF16__)
#define OCTAVO_QUANT_PAIRS 1
#else
#define OCTAVO_QUANT_PAIRS 0
#endif
// AMX batches (quant_amx.h): only in the AVX512-BF16 build, on x86-64 Linux (tile-state permission)
#if defined(OCTAVO_ISA_AVX512) && defined(__AVX512BF16__) && defined(__x86_64__) && defined(__linux__)
#define OCTAVO_QUANT_AMX 1
#include "amx.h"
#else
#define OCTAVO_QUANT_AMX 0
#endif
// int8-activation layers (quant_a8.h): the AVX-512 builds on x86-64 (VNNI checked at run time)
#if defined(OCTAVO_ISA_AVX512) && defined(__x86_64__)
#define OCTAVO_QUANT_A8 1
#include <cpuid.h>
#include <math.h>
#else
#define OCTAVO_QUANT_A8 0
#endif

namespace octavo {
namespace OCTAVO_ISA_NS {
namespace quant {

// ------------------------------------------------------------------------------------------
// code decode: 16 uint8 codes -> F; 16 bytes of nibble pairs -> (low nibbles, high nibbles)

#if defined(OCTAVO_ISA_AVX512)
constexpr int kMR = 8;
constexpr int kGemvTiles = 4;  // batch 1: tiles streamed side by side (32 vector registers)
static inline F codes8(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)))};
}
static inline void codes4(const uint8_t* p, F& lo, F& hi) {
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  lo.v = _mm512_cvtepi32_ps(_mm512_and_si512(d, _mm512_set1_epi32(15)));
  hi.v = _mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4));
}
#elif defined(OCTAVO_ISA_AVX2)
constexpr int kMR = 2;
constexpr int kGemvTiles = 2;
static inline __m256i widen8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
}
static inline F codes8(const uint8_t* p) {
  return {_mm256_cvtepi32_ps(widen8(p)), _mm256_cvtepi32_ps(widen8(p + 8))};
}
static inline void codes4(const uint8_t* p, F& lo, F& hi) {
  const __m256i a = widen8(p), b = widen8(p + 8), m = _mm256_set1_epi32(15);
  lo.a = _mm256_cvtepi32_ps(_mm256_and_si256(a, m));
  lo.b = _mm256_cvtepi32_ps(_mm256_and_si256(b, m));
  hi.a = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
  hi.b = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
#elif defined(OCTAVO_ISA_NEON)
constexpr int kMR = 2;
constexpr int kGemvTiles = 2;
static inline F widen_u8x16(uint8x16_t b) {
  const uint16x8_t l = vmovl_u8(vget_low_u8(b)), h = vmovl_u8(vget_high_u8(b));
  F r;
  r.v[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(l)));
  r.v[1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(l)));
  r.v[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(h)));
  r.v[3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(h)));
  return r;
}
static inline F codes8(const uint8_t* p) { return widen_u8x16(vld1q_u8(p)); }
static inline void codes4(const uint8_t* p, F& lo, F& hi) {
  const uint8x16_t b = vld1q_u8(p);
  lo = widen_u8x16(vandq_u8(b, vdupq_n_u8(15)));
  hi = widen_u8x16(vshrq_n_u8(b, 4));
}
#else
constexpr int kMR = 2;
constexpr int kGemvTiles = 1;
static inline F codes8(const uint8_t* p) {
  F r;
  for (int i = 0; i < 16; ++i) r.v[i] = (float)p[i];
  return r;
}
static inline void codes4(const uint8_t* p, F& lo, F& hi) {
  for (int i = 0; i < 16; ++i) { lo.v[i] = (float)(p[i] & 15); hi.v[i] = (float)(p[i] >> 4); }
}
#endif

// ------------------------------------------------------------------------------------------
// element types of x / out

template <int DT> struct Act;
template <> struct Act<kFloat32> {
  using T = float;
  static inline F load16(const T* p) { return load(p); }
  static inline void store16(T* p, F x) { store(p, x); }
  static inline float to_f(T x) { return x; }
  static inline T from_f(float x) { return x; }
};
template <> struct Act<kBFloat16> {
  using T = uint16_t;
  static inline F load16(const T* p) { return load_bf16(p); }
#if defined(OCTAVO_ISA_AVX512) && defined(__AVX512BF16__)
  // VCVTNEPS2BF16: round to nearest even in one instruction
  static inline void store16(T* p, F x) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(x.v)); }
#else
  static inline void store16(T* p, F x) { store_bf16(p, x); }
#endif
  static inline float to_f(T x) { return bf16_bits_to_f32(x); }
  static inline T from_f(float x) { return f32_to_bf16_bits(x); }
};
template <> struct Act<kFloat16> {
  using T = uint16_t;
  static inline F load16(const T* p) { return load_f16(p); }
  static inline void store16(T* p, F x) { store_f16(p, x); }
  static inline float to_f(T x) { return f16_bits_to_f32(x); }
  static inline T from_f(float x) { return f32_to_f16_bits(x); }
};

static inline int64_t k_rows(const IntWeights& w) { return w.bits == 8 ? w.k : (w.k + 1) / 2; }
static inline int64_t n_tiles(const IntWeights& w) { return (w.n + kQuantTile - 1) / kQuantTile; }
static inline int n_groups(const IntWeights& w) { return w.k / w.group; }

// Shared per call: x in fp32 (rows padded to an even length with zeros), per-group sums of x.
struct LinearCtx {
  const IntLinearArgs* a;
  const float* xf;    // [m][kp]
  const float* xsum;  // [m][G]
  int64_t kp;
  int64_t tiles_per_item;
};

template <int DT>
static void store_tile(const IntLinearArgs& a, int64_t row, int64_t n0, F y0, F y1) {
  using E = Act<DT>;
  typename E::T* o = (typename E::T*)a.out + row * a.o_stride + n0;
  const int64_t cols = a.w.n - n0 < kQuantTile ? a.w.n - n0 : kQuantTile;
  if (cols == kQuantTile) {
    if (a.bias) { y0 = add(y0, load(a.bias + n0)); y1 = add(y1, load(a.bias + n0 + 16)); }
    E::store16(o, y0);
    E::store16(o + 16, y1);
    return;
  }
  float t[kQuantTile];
  store(t, y0);
  store(t + 16, y1);
  for (int64_t j = 0; j < cols; ++j) o[j] = E::from_f(t[j] + (a.bias ? a.bias[n0 + j] : 0.f));
}

// ------------------------------------------------------------------------------------------
// batch 1

// Bytes ahead each tile's stream is prefetched: the hardware prefetcher alone left the batch-1
// kernels ~10-15% short end to end (SmolLM2-135M shape, 2 threads: the INT8 stack 6.7 -> 5.7 ms
// per token, INT4 g32 5.1 -> 4.7 ms; 2 KiB measured the same).
constexpr int kGemvPrefetch = 1024;
// Sum over the k rows [r0, r1) of NT tiles side by side (8-bit: a row per k; 4-bit: a row per
// pair of k). NT tiles are NT sequential streams: one stream per core leaves the memory system
// idle between the hardware prefetcher's requests (~half the bandwidth measured), several keep
// enough lines in flight. tile_stride: bytes from one tile's codes to the next tile's.
template <int BITS, int NT>
static inline void gemv_group(const uint8_t* wp, int64_t tile_stride, const float* x, int64_t r0, int64_t r1,
                              F (&acc)[NT][2]) {
  F b[NT][2];
  for (int t = 0; t < NT; ++t) b[t][0] = b[t][1] = zero();
  wp += r0 * kQuantTile;
  if constexpr (BITS == 8) {
    int64_t r = r0;
    for (; r + 1 < r1; r += 2, wp += 2 * kQuantTile) {
      const F xa = bcast(x[r]), xb = bcast(x[r + 1]);
      for (int t = 0; t < NT; ++t) {
        const uint8_t* p = wp + t * tile_stride;
        __builtin_prefetch(p + kGemvPrefetch);
        acc[t][0] = fma(codes8(p), xa, acc[t][0]);
        acc[t][1] = fma(codes8(p + 16), xa, acc[t][1]);
        b[t][0] = fma(codes8(p + 32), xb, b[t][0]);
        b[t][1] = fma(codes8(p + 48), xb, b[t][1]);
      }
    }
    if (r < r1) {
      const F xa = bcast(x[r]);
      for (int t = 0; t < NT; ++t) {
        acc[t][0] = fma(codes8(wp + t * tile_stride), xa, acc[t][0]);
        acc[t][1] = fma(codes8(wp + t * tile_stride + 16), xa, acc[t][1]);
      }
    }
  } else {
    for (int64_t r = r0; r < r1; ++r, wp += kQuantTile) {
      const F xa = bcast(x[2 * r]), xb = bcast(x[2 * r + 1]);
      for (int t = 0; t < NT; ++t) {
        F l0, h0, l1, h1;
        if (r & 1) __builtin_prefetch(wp + t * tile_stride + kGemvPrefetch);
        codes4(wp + t * tile_stride, l0, h0);
        codes4(wp + t * tile_stride + 16, l1, h1);
        acc[t][0] = fma(l0, xa, acc[t][0]);
        acc[t][1] = fma(l1, xa, acc[t][1]);
        b[t][0] = fma(h0, xb, b[t][0]);
        b[t][1] = fma(h1, xb, b[t][1]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    acc[t][0] = add(acc[t][0], b[t][0]);
    acc[t][1] = add(acc[t][1], b[t][1]);
  }
}

// Batch 1 streams a tile's scales (and zeros, where they are not one constant) beside its codes:
// two lines per tile and scale group, read when the group ends. Without a prefetch each of them
// came from memory then, a wait every 16 code rows at groups of 32 (INT4 g32, every linear of
// the SmolLM2-135M shape at batch 1, 2-core Zen 5, same process: 0.89-0.90x the time with them
// prefetched kScaleAhead groups ahead). s, z: the first tile's scales and zeros of this call.
constexpr int kScaleAhead = 4;
template <int NT>
static inline void prefetch_scales(const float* s, const float* z, int64_t sz_stride, int g, int G, bool zeros) {
  if (g + kScaleAhead >= G) return;
  const int64_t off = (int64_t)(g + kScaleAhead) * kQuantTile;
  for (int t = 0; t < NT; ++t) {
    __builtin_prefetch(s + t * sz_stride + off);
    __builtin_prefetch(s + t * sz_stride + off + 16);
    if (zeros) {
      __builtin_prefetch(z + t * sz_stride + off);
      __builtin_prefetch(z + t * sz_stride + off + 16);
    }
  }
}

// NT consecutive tiles from tile0, batch 1
template <int DT, int BITS, int NT>
static void gemv_tiles(const LinearCtx& c, int64_t tile0) {
  const IntWeights& w = c.a->w;
  const int G = n_groups(w);
  const int64_t rows_per_group = BITS == 8 ? w.group : w.group / 2;
  const int64_t nrows = k_rows(w);
  const int64_t tile_stride = nrows * kQuantTile;
  const uint8_t* wp = w.weight + tile0 * tile_stride;
  const int64_t sz_stride = (int64_t)G * kQuantTile;  // floats per tile of scales / zeros
  const float* s = w.scales + tile0 * sz_stride;
  const float* z = w.zeros + tile0 * sz_stride;
  F y[NT][2];
  for (int t = 0; t < NT; ++t) y[t][0] = y[t][1] = zero();
  for (int g = 0; g < G; ++g) {
    const int64_t r0 = g * rows_per_group;
    const int64_t r1 = g + 1 == G ? nrows : r0 + rows_per_group;
    F a[NT][2];
    for (int t = 0; t < NT; ++t) a[t][0] = a[t][1] = zero();
    prefetch_scales<NT>(s, z, sz_stride, g, G, w.zero_point < 0.f);
    gemv_group<BITS, NT>(wp, tile_stride, c.xf, r0, r1, a);
    const F xs = bcast(c.xsum[g]);
    if (w.zero_point >= 0.f) {  // the same products, the zero point from a register
      const F zx = mul(bcast(w.zero_point), xs);
      for (int t = 0; t < NT; ++t) {
        const float* sg = s + t * sz_stride + g * kQuantTile;
        y[t][0] = fma(load(sg), sub(a[t][0], zx), y[t][0]);
        y[t][1] = fma(load(sg + 16), sub(a[t][1], zx), y[t][1]);
      }
      continue;
    }
    for (int t = 0; t < NT; ++t) {
      const float* sg = s + t * sz_stride + g * kQuantTile;
      const float* zg = z + t * sz_stride + g * kQuantTile;
      y[t][0] = fma(load(sg), sub(a[t][0], mul(load(zg), xs)), y[t][0]);
      y[t][1] = fma(load(sg + 16), sub(a[t][1], mul(load(zg + 16), xs)), y[t][1]);
    }
  }
  for (int t = 0; t < NT; ++t) store_tile<DT>(*c.a, 0, (tile0 + t) * kQuantTile, y[t][0], y[t][1]);
}

// ------------------------------------------------------------------------------------------
// batch > 1: MR rows share every dequantized weight vector

template <int MR>
static inline void fma_rows(F (&acc)[MR][2], F w0, F w1, const float* x, int64_t kp, int64_t k) {
  for (int i = 0; i < MR; ++i) {
    const F xb = bcast(x[i * kp + k]);
    acc[i][0] = fma(w0, xb, acc[i][0]);
    acc[i][1] = fma(w1, xb, acc[i][1]);
  }
}

template <int DT, int BITS, int MR>
static void gemm_block(const LinearCtx& c, int64_t tile, int64_t m0) {
  const IntWeights& w = c.a->w;
  const int G = n_groups(w);
  const int64_t rows_per_group = BITS == 8 ? w.group : w.group / 2;
  const int64_t nrows = k_rows(w);
  const uint8_t* wp = w.weight + tile * nrows * kQuantTile;
  const float* s = w.scales + tile * (int64_t)G * kQuantTile;
  const float* z = w.zeros + tile * (int64_t)G * kQuantTile;
  const float* x = c.xf + m0 * c.kp;
  F acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = zero();
  for (int g = 0; g < G; ++g) {
    const F s0 = load(s + g * kQuantTile), s1 = load(s + g * kQuantTile + 16);
    const F z0 = load(z + g * kQuantTile), z1 = load(z + g * kQuantTile + 16);
    const int64_t r1 = g + 1 == G ? nrows : (g + 1) * rows_per_group;
    for (int64_t r = g * rows_per_group; r < r1; ++r) {
      const uint8_t* p = wp + r * kQuantTile;
      if constexpr (BITS == 8) {
        fma_rows<MR>(acc, mul(sub(codes8(p), z0), s0), mul(sub(codes8(p + 16), z1), s1), x, c.kp, r);
      } else {
        F l0, h0, l1, h1;
        codes4(p, l0, h0);
        codes4(p + 16, l1, h1);
        fma_rows<MR>(acc, mul(sub(l0, z0), s0), mul(sub(l1, z1), s1), x, c.kp, 2 * r);
        fma_rows<MR>(acc, mul(sub(h0, z0), s0), mul(sub(h1, z1), s1), x, c.kp, 2 * r + 1);
      }
    }
  }
  for (int i = 0; i < MR; ++i) store_tile<DT>(*c.a, m0 + i, tile * kQuantTile, acc[i][0], acc[i][1]);
}

template <int DT, int BITS>
static void gemm_tile(const LinearCtx& c, int64_t tile) {
  const int64_t m = c.a->m;
  int64_t m0 = 0;
  for (; m0 + kMR <= m; m0 += kMR) gemm_block<DT, BITS, kMR>(c, tile, m0);
  switch (m - m0) {  // the remaining rows (< kMR)
#define OCTAVO_QUANT_REST(r) \
  case r: if constexpr (r < kMR) gemm_block<DT, BITS, (r < kMR ? r : 1)>(c, tile, m0); break;
    OCTAVO_QUANT_REST(1) OCTAVO_QUANT_REST(2) OCTAVO_QUANT_REST(3) OCTAVO_QUANT_REST(4)
    OCTAVO_QUANT_REST(5) OCTAVO_QUANT_REST(6) OCTAVO_QUANT_REST(7)
#undef OCTAVO_QUANT_REST
    default: break;
  }
}

template <int N> struct Tiles { static constexpr int value = N; };

// Tiles [t0, t1) of a single row in passes of kGemvTiles side by side, then 2, then 1:
// pass(Tiles<n>(), first tile) (the batch-1 kernels of this file and quant_a8.h).
template <class Pass>
static inline void tile_passes(int64_t t0, int64_t t1, Pass&& pass) {
  int64_t t = t0;
  for (; t + kGemvTiles <= t1; t += kGemvTiles) pass(Tiles<kGemvTiles>(), t);
  if (kGemvTiles > 2)
    for (; t + 2 <= t1; t += 2) pass(Tiles<(kGemvTiles > 2 ? 2 : 1)>(), t);
  for (; t < t1; ++t) pass(Tiles<1>(), t);
}

// Tiles per work item. Batches: runs long enough to stream, short enough that every thread gets
// several (dynamic hand-out). One row: every thread an equal share of whole tiles, in as few
// items as runs of <= 16 tiles allow -- a thread's tiles are then passes of kGemvTiles streams
// side by side, and no thread waits at the end for another's extra item (with 18 tiles, the
// 576-wide layers, items of 2 left one of two threads idle for a ninth of the call). Batches
// likewise take the largest run whose item count is a multiple of the threads where one exists
// (18 tiles, 2 threads: 18 items of 1, not 9 of 2).
static inline int64_t tiles_per_item(int64_t nt, int64_t m, int threads) {
  if (m == 1) {
    const int64_t share = (nt + threads - 1) / threads, pieces = (share + 15) / 16;
    return (share + pieces - 1) / pieces;
  }
  int64_t per = nt / ((int64_t)threads * 4);
  per = per < 1 ? 1 : per > 16 ? 16 : per;
  for (int64_t p = per; p > 1 && threads > 1; --p)
    if (((nt + p - 1) / p) % threads == 0) return p;
  return threads > 1 && nt % threads == 0 ? 1 : per;
}

template <int DT, int BITS>
static void linear_item(void* ctx, int64_t item, int) {
  const LinearCtx& c = *(const LinearCtx*)ctx;
  const int64_t t0 = item * c.tiles_per_item, nt = n_tiles(c.a->w);
  const int64_t t1 = t0 + c.tiles_per_item < nt ? t0 + c.tiles_per_item : nt;
  if (c.a->m == 1) {
    tile_passes(t0, t1, [&](auto n, int64_t t) { gemv_tiles<DT, BITS, decltype(n)::value>(c, t); });
    return;
  }
  for (int64_t t = t0; t < t1; ++t) gemm_tile<DT, BITS>(c, t);
}

// x -> fp32 rows of length kp (zero tail), and the per-group sums of each row.
template <int DT>
static void prepare_x(const IntLinearArgs& a, float* xf, float* xsum, int64_t kp) {
  using E = Act<DT>;
  const int64_t K = a.w.k, kv = K & ~(int64_t)15;
  const int G = n_groups(a.w);
  for (int64_t i = 0; i < a.m; ++i) {
    const typename E::T* src = (const typename E::T*)a.x + i * a.x_stride;
    float* dst = xf + i * kp;
    for (int64_t k = 0; k < kv; k += 16) store(dst + k, E::load16(src + k));
    for (int64_t k = kv; k < K; ++k) dst[k] = E::to_f(src[k]);
    for (int64_t k = K; k < kp; ++k) dst[k] = 0.f;
    for (int g = 0; g < G; ++g) {
      F s = zero();
      float t = 0.f;
      const int64_t k0 = (int64_t)g * a.w.group, k1 = k0 + a.w.group, kv1 = k0 + ((k1 - k0) & ~(int64_t)15);
      for (int64_t k = k0; k < kv1; k += 16) s = add(s, load(dst + k));
      for (int64_t k = kv1; k < k1; ++k) t += dst[k];
      xsum[i * G + g] = hsum(s) + t;
    }
  }
}

static const char* check_weights(const IntWeights& w) {
  if (w.bits != 8 && w.bits != 4) return "bits must be 8 or 4";
  if (w.n <= 0 || w.k <= 0 || w.group <= 0 || w.k % w.group) return "K must be a positive multiple of group";
  if (w.bits == 4 && w.group % 2 && w.group != w.k) return "4-bit weights need an even group (or one group per row)";
  return nullptr;
}

#include "tls_buffer.h"  // struct TlsBuffer, in this ISA namespace
#include "quant_pairs.h"
#include "quant_amx.h"
#include "quant_dpbf16.h"
#include "quant_a8.h"

template <int DT>
static const char* linear_dt(const IntLinearArgs& a) {
#if OCTAVO_QUANT_AMX
  if (DT == kBFloat16 && amx_applies(a)) return amx_linear(a);
#endif
#if OCTAVO_QUANT_PAIRS
  if (DT == kBFloat16 && dp_applies(a)) return dp_linear(a);
#endif
  const int64_t kp = (a.w.k + 1) & ~(int64_t)1;
  const int G = n_groups(a.w);
  float* buf = (float*)malloc(sizeof(float) * (size_t)(a.m * (kp + G)));
  if (!buf) return "out of memory for the activation buffer";
  prepare_x<DT>(a, buf, buf + a.m * kp, kp);
  const int threads = threading::resolve_threads(a.num_threads);
  const int64_t nt = n_tiles(a.w), per = tiles_per_item(nt, a.m, threads);
  LinearCtx c{&a, buf, buf + a.m * kp, kp, per};
  const int64_t items = (nt + per - 1) / per;
  void (*fn)(void*, int64_t, int) = a.w.bits == 8 ? &linear_item<DT, 8> : &linear_item<DT, 4>;
  threading::parallel_run(items, items > 1 ? threads : 1, fn, &c);
  free(buf);
  return nullptr;
}

// ------------------------------------------------------------------------------------------
// dequantize, transposed: out[k, n] = (q[n, k] - z) * s in the output dtype (rows of o_stride
// elements), so each weight row of a tile is two vector stores; the large-batch path hands
// these [K, n] blocks to the BLAS as the transposed weight.

// one dequantized row of a tile (32 channels) into out (cols <= 32 of them)
template <int DT>
static inline void put_row(typename Act<DT>::T* row, int64_t cols, F v0, F v1) {
  using E = Act<DT>;
  if (cols == kQuantTile) {
    E::store16(row, v0);
    E::store16(row + 16, v1);
    return;
  }
  float t[kQuantTile];
  store(t, v0);
  store(t + 16, v1);
  for (int64_t j = 0; j < cols; ++j) row[j] = E::from_f(t[j]);
}

template <int DT, int BITS>
static void dequant_item(void* ctx, int64_t tile, int) {
  const IntDequantArgs& a = *(const IntDequantArgs*)ctx;
  const IntWeights& w = a.w;
  const int G = n_groups(w);
  const int64_t nrows = k_rows(w), n0 = tile * kQuantTile;
  const int64_t cols = w.n - n0 < kQuantTile ? w.n - n0 : kQuantTile;
  const uint8_t* wp = w.weight + tile * nrows * kQuantTile;
  typename Act<DT>::T* o = (typename Act<DT>::T*)a.out + n0;
  const int64_t os = a.o_stride;
  for (int g = 0; g < G; ++g) {
    const float* sg = w.scales + (tile * G + g) * kQuantTile;
    const float* zg = w.zeros + (tile * G + g) * kQuantTile;
    const F s0 = load(sg), s1 = load(sg + 16), z0 = load(zg), z1 = load(zg + 16);
    const int64_t k0 = (int64_t)g * w.group, k1 = k0 + w.group;
    if constexpr (BITS == 8) {
      for (int64_t k = k0; k < k1; ++k) {
        const uint8_t* p = wp + k * kQuantTile;
        put_row<DT>(o + k * os, cols, mul(sub(codes8(p), z0), s0), mul(sub(codes8(p + 16), z1), s1));
      }
    } else {
      for (int64_t k = k0; k < k1; k += 2) {
        F l0, h0, l1, h1;
        codes4(wp + (k / 2) * kQuantTile, l0, h0);
        codes4(wp + (k / 2) * kQuantTile + 16, l1, h1);
        put_row<DT>(o + k * os, cols, mul(sub(l0, z0), s0), mul(sub(l1, z1), s1));
        if (k + 1 < k1) put_row<DT>(o + (k + 1) * os, cols, mul(sub(h0, z0), s0), mul(sub(h1, z1), s1));
      }
    }
  }
}

}  // namespace quant

static const char* int_linear(const IntLinearArgs& a) {
  if (const char* e = quant::check_weights(a.w)) return e;
  if (a.m <= 0) return nullptr;
  switch (a.dtype) {
    case kFloat32: return quant::linear_dt<kFloat32>(a);
    case kBFloat16: return quant::linear_dt<kBFloat16>(a);
    case kFloat16: return quant::linear_dt<kFloat16>(a);
    default: return "unsupported dtype";
  }
}

// W8A8 / W4A8: x quantized to int8 per row (quant_a8.h); an error where this build or CPU cannot.
static const char* int_linear_a8(const IntLinearArgs& a) {
  if (const char* e = quant::check_weights(a.w)) return e;
#if OCTAVO_QUANT_A8
  if (a.m <= 0) return quant::a8_unsupported(a);
  switch (a.dtype) {
    case kFloat32: return quant::a8_linear_dt<kFloat32>(a);
    case kBFloat16: return quant::a8_linear_dt<kBFloat16>(a);
    case kFloat16: return quant::a8_linear_dt<kFloat16>(a);
    default: return "unsupported dtype";
  }
#else
  return "int8 activations need an AVX-512 build with AVX512-VNNI (this build has none)";
#endif
}

// Whether int_linear_a8 runs on this CPU with this build.
static bool int_a8() {
#if OCTAVO_QUANT_A8
  return quant::a8_ready();
#else
  return false;
#endif
}

static const char* int_dequant(const IntDequantArgs& a) {
  if (const char* e = quant::check_weights(a.w)) return e;
  void (*fn)(void*, int64_t, int) = nullptr;
  const bool b8 = a.w.bits == 8;
  switch (a.dtype) {
    case kFloat32: fn = b8 ? &quant::dequant_item<kFloat32, 8> : &quant::dequant_item<kFloat32, 4>; break;
    case kBFloat16: fn = b8 ? &quant::dequant_item<kBFloat16, 8> : &quant::dequant_item<kBFloat16, 4>; break;
    case kFloat16: fn = b8 ? &quant::dequant_item<kFloat16, 8> : &quant::dequant_item<kFloat16, 4>; break;
    default: return "unsupported dtype";
  }
  const int64_t nt = quant::n_tiles(a.w);
  threading::parallel_run(nt, nt > 1 ? a.num_threads : 1, fn, (void*)&a);
  return nullptr;
}

// Whether int_linear runs bf16 batches of >= 5 rows on AMX here (any number of rows; groups of
// a multiple of 32, or one group per row).
static bool int_amx() {
#if OCTAVO_QUANT_AMX
  return quant::amx_ready();
#else
  return false;
#endif
}

// Whether int_linear runs bf16 batches of >= IntLinearArgs::dp_min_rows rows on VDPBF16PS here.
static bool int_dpbf16() { return OCTAVO_QUANT_PAIRS != 0; }

// The table this ISA's quantized-linear translation unit exports (quant_kernels.cpp).
const QuantKernels* quant_kernels() {
  static const QuantKernels table = {kIsaName, &int_linear, &int_dequant, &int_amx, &int_linear_a8, &int_a8,
                                     &int_dpbf16};
  return &table;
}

}  // namespace OCTAVO_ISA_NS
}  // namespace octavo
