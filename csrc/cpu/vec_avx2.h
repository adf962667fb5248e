// AVX2 + FMA + F16C vector layer: a logical 16-float vector is two ymm registers.
#pragma once
#include <immintrin.h>
#include <stdint.h>

namespace octavo {
namespace OCTAVO_ISA_NS {

constexpr const char* kIsaName = "avx2";
constexpr bool kHasBf16Dot = false;
constexpr int kQkAcc = 6;  // Q.K^T accumulators (rows x token groups)
constexpr int kQkRows = 4;
constexpr int kPvRows = 2;
constexpr int kPvCols = 2;

struct F { __m256 a, b; };
struct R { __m256i a, b; };

static inline F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline F bcast(float x) { __m256 v = _mm256_set1_ps(x); return {v, v}; }
static inline F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void store(float* p, F x) { _mm256_storeu_ps(p, x.a); _mm256_storeu_ps(p + 8, x.b); }
static inline F add(F x, F y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
static inline F sub(F x, F y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
static inline F mul(F x, F y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
static inline F div(F x, F y) { return {_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)}; }
static inline F max(F x, F y) { return {_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)}; }
static inline F min(F x, F y) { return {_mm256_min_ps(x.a, y.a), _mm256_min_ps(x.b, y.b)}; }
static inline F fma(F x, F y, F z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline float hmax(F x) {
  __m256 v = _mm256_max_ps(x.a, x.b);
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline float hsum(F x) { return hsum8(_mm256_add_ps(x.a, x.b)); }
static inline F round_nearest(F x) {
  const int m = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.a, m), _mm256_round_ps(x.b, m)};
}
static inline __m256 pow2i8(__m256 n) {
  __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(i, 23));
}
static inline F pow2i(F n) { return {pow2i8(n.a), pow2i8(n.b)}; }

static inline __m256 bf16x8_to_f32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline F load_bf16(const uint16_t* p) {
  return {bf16x8_to_f32(_mm_loadu_si128((const __m128i*)p)), bf16x8_to_f32(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
static inline F load_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
static inline __m256i f32x8_to_bf16_bits(__m256 v) {  // 8 results in the low 16 bits of each lane
  __m256i x = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}
static inline __m256i pack_u32_to_u16(__m256i lo, __m256i hi) {  // values must be < 65536
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
}
static inline void store_bf16(uint16_t* p, F x) {
  _mm256_storeu_si256((__m256i*)p, pack_u32_to_u16(f32x8_to_bf16_bits(x.a), f32x8_to_bf16_bits(x.b)));
}
static inline void store_f16(uint16_t* p, F x) {
  const int m = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(x.a, m));
  _mm_storeu_si128((__m128i*)(p + 8), _mm256_cvtps_ph(x.b, m));
}

static inline R load_raw(const uint16_t* p) {
  return {_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)(p + 16))};
}
static inline void split_bf16(R x, F& lo, F& hi) {
  const __m256i m = _mm256_set1_epi32((int)0xFFFF0000u);
  lo.a = _mm256_castsi256_ps(_mm256_slli_epi32(x.a, 16));
  lo.b = _mm256_castsi256_ps(_mm256_slli_epi32(x.b, 16));
  hi.a = _mm256_castsi256_ps(_mm256_and_si256(x.a, m));
  hi.b = _mm256_castsi256_ps(_mm256_and_si256(x.b, m));
}
static inline void split_f16(R x, F& lo, F& hi) {
  const __m256i m = _mm256_set1_epi32(0xFFFF);
  __m256i l = pack_u32_to_u16(_mm256_and_si256(x.a, m), _mm256_and_si256(x.b, m));
  __m256i h = pack_u32_to_u16(_mm256_srli_epi32(x.a, 16), _mm256_srli_epi32(x.b, 16));
  lo.a = _mm256_cvtph_ps(_mm256_castsi256_si128(l));
  lo.b = _mm256_cvtph_ps(_mm256_extracti128_si256(l, 1));
  hi.a = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi.b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}
static inline F dot_bf16_pair(F acc, R b, uint32_t a) {
  F lo, hi;
  split_bf16(b, lo, hi);
  float alo, ahi;
  uint32_t l = a << 16, h = a & 0xFFFF0000u;
  __builtin_memcpy(&alo, &l, 4);
  __builtin_memcpy(&ahi, &h, 4);
  return fma(hi, bcast(ahi), fma(lo, bcast(alo), acc));
}

// Round to bf16 / fp16 and back, in registers (round to nearest even, like torch).
static inline __m256 round_bf16_8(__m256 v) {
  __m256i x = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}
static inline F round_bf16(F x) { return {round_bf16_8(x.a), round_bf16_8(x.b)}; }
static inline F round_f16(F x) {
  const int m = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_cvtph_ps(_mm256_cvtps_ph(x.a, m)), _mm256_cvtph_ps(_mm256_cvtps_ph(x.b, m))};
}

}  // namespace OCTAVO_ISA_NS
}  // namespace octavo
