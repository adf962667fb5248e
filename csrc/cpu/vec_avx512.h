// AVX-512 (F/BW/VL/DQ) vector layer; with -mavx512bf16 the bf16 dot product is VDPBF16PS.
// F is one zmm of 16 floats; R is one zmm of 16 raw 32-bit lanes (a pair of 16-bit values each).
#pragma once
#include <immintrin.h>
#include <stdint.h>

namespace octavo {
namespace OCTAVO_ISA_NS {

#ifdef __AVX512BF16__
constexpr const char* kIsaName = "avx512_bf16";
constexpr bool kHasBf16Dot = true;
#else
constexpr const char* kIsaName = "avx512";
constexpr bool kHasBf16Dot = false;
#endif
// Micro-kernel shapes: rows per Q.K^T tile; rows x 16-column vectors per P.V tile.
constexpr int kQkAcc = 24;  // Q.K^T accumulators (rows x token groups)
constexpr int kQkRows = 8;
constexpr int kPvRows = 4;
constexpr int kPvCols = 4;

struct F { __m512 v; };
struct R { __m512i v; };

static inline F zero() { return {_mm512_setzero_ps()}; }
static inline F bcast(float x) { return {_mm512_set1_ps(x)}; }
static inline F load(const float* p) { return {_mm512_loadu_ps(p)}; }
static inline void store(float* p, F a) { _mm512_storeu_ps(p, a.v); }
static inline F add(F a, F b) { return {_mm512_add_ps(a.v, b.v)}; }
static inline F sub(F a, F b) { return {_mm512_sub_ps(a.v, b.v)}; }
static inline F mul(F a, F b) { return {_mm512_mul_ps(a.v, b.v)}; }
static inline F div(F a, F b) { return {_mm512_div_ps(a.v, b.v)}; }
static inline F max(F a, F b) { return {_mm512_max_ps(a.v, b.v)}; }
static inline F min(F a, F b) { return {_mm512_min_ps(a.v, b.v)}; }
static inline F fma(F a, F b, F c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }  // a*b+c
static inline float hmax(F a) { return _mm512_reduce_max_ps(a.v); }
static inline float hsum(F a) { return _mm512_reduce_add_ps(a.v); }
static inline F round_nearest(F a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
// 2^n for integral n in [-127, 127]; n = -127 gives exactly 0.
static inline F pow2i(F n) {
  __m512i i = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(i, 23))};
}

// 16 contiguous 16-bit values <-> 16 floats.
static inline F load_bf16(const uint16_t* p) {
  __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(x, 16))};
}
static inline F load_f16(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))};
}
static inline void store_bf16(uint16_t* p, F a) {
  // round to nearest even; NaN -> quiet NaN (what torch does)
  __m512i x = _mm512_castps_si512(a.v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(r));
}
static inline void store_f16(uint16_t* p, F a) {
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 16 lanes of 16-bit pairs (32 values): lo = even elements, hi = odd elements.
static inline R load_raw(const uint16_t* p) { return {_mm512_loadu_si512((const void*)p)}; }
static inline void split_bf16(R x, F& lo, F& hi) {
  lo.v = _mm512_castsi512_ps(_mm512_slli_epi32(x.v, 16));
  hi.v = _mm512_castsi512_ps(_mm512_and_si512(x.v, _mm512_set1_epi32((int)0xFFFF0000u)));
}
static inline void split_f16(R x, F& lo, F& hi) {
  lo.v = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x.v));
  hi.v = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(x.v, 16)));
}
// acc[i] += b.lo[i] * a.lo + b.hi[i] * a.hi, a = one bf16 pair (low half first).
static inline F dot_bf16_pair(F acc, R b, uint32_t a) {
#ifdef __AVX512BF16__
  return {_mm512_dpbf16_ps(acc.v, (__m512bh)b.v, (__m512bh)_mm512_set1_epi32((int)a))};
#else
  F lo, hi;
  split_bf16(b, lo, hi);
  float alo, ahi;
  uint32_t l = a << 16, h = a & 0xFFFF0000u;
  __builtin_memcpy(&alo, &l, 4);
  __builtin_memcpy(&ahi, &h, 4);
  return fma(hi, bcast(ahi), fma(lo, bcast(alo), acc));
#endif
}

// Round to bf16 / fp16 and back, in registers (round to nearest even, like torch).
static inline F round_bf16(F a) {
  __m512i x = _mm512_castps_si512(a.v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u));
  __mmask16 nan = _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q);
  return {_mm512_mask_mov_ps(_mm512_castsi512_ps(r), nan, a.v)};
}
static inline F round_f16(F a) {
  return {_mm512_cvtph_ps(_mm512_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))};
}

}  // namespace OCTAVO_ISA_NS
}  // namespace octavo
