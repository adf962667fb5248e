// AArch64 NEON (ASIMD) vector layer: a logical 16-float vector is four q registers.
#pragma once
#include <arm_neon.h>
#include <stdint.h>

namespace octavo {
namespace OCTAVO_ISA_NS {

constexpr const char* kIsaName = "neon";
constexpr bool kHasBf16Dot = false;
constexpr int kQkAcc = 6;  // Q.K^T accumulators (rows x token groups)
constexpr int kQkRows = 4;
constexpr int kPvRows = 2;
constexpr int kPvCols = 2;

struct F { float32x4_t v[4]; };
struct R { uint16x8_t lo[2], hi[2]; };  // deinterleaved: even elements, odd elements

#define OCTAVO_NEON_MAP2(expr) \
  F r; for (int i = 0; i < 4; ++i) r.v[i] = expr; return r

static inline F zero() { F r; for (int i = 0; i < 4; ++i) r.v[i] = vdupq_n_f32(0.f); return r; }
static inline F bcast(float x) { F r; for (int i = 0; i < 4; ++i) r.v[i] = vdupq_n_f32(x); return r; }
static inline F load(const float* p) { F r; for (int i = 0; i < 4; ++i) r.v[i] = vld1q_f32(p + 4 * i); return r; }
static inline void store(float* p, F a) { for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.v[i]); }
static inline F add(F a, F b) { OCTAVO_NEON_MAP2(vaddq_f32(a.v[i], b.v[i])); }
static inline F sub(F a, F b) { OCTAVO_NEON_MAP2(vsubq_f32(a.v[i], b.v[i])); }
static inline F mul(F a, F b) { OCTAVO_NEON_MAP2(vmulq_f32(a.v[i], b.v[i])); }
static inline F div(F a, F b) { OCTAVO_NEON_MAP2(vdivq_f32(a.v[i], b.v[i])); }
static inline F max(F a, F b) { OCTAVO_NEON_MAP2(vmaxq_f32(a.v[i], b.v[i])); }
static inline F min(F a, F b) { OCTAVO_NEON_MAP2(vminq_f32(a.v[i], b.v[i])); }
static inline F fma(F a, F b, F c) { OCTAVO_NEON_MAP2(vfmaq_f32(c.v[i], a.v[i], b.v[i])); }
static inline float hmax(F a) {
  return vmaxvq_f32(vmaxq_f32(vmaxq_f32(a.v[0], a.v[1]), vmaxq_f32(a.v[2], a.v[3])));
}
static inline float hsum(F a) {
  return vaddvq_f32(vaddq_f32(vaddq_f32(a.v[0], a.v[1]), vaddq_f32(a.v[2], a.v[3])));
}
static inline F round_nearest(F a) { OCTAVO_NEON_MAP2(vrndnq_f32(a.v[i])); }
static inline F pow2i(F n) {
  OCTAVO_NEON_MAP2(vreinterpretq_f32_s32(
      vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n.v[i]), vdupq_n_s32(127)), 23)));
}

static inline float32x4_t bf16x4_to_f32(uint16x4_t h) { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }
static inline float32x4_t f16x4_to_f32(uint16x4_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }
static inline F load_bf16(const uint16_t* p) {
  uint16x8_t a = vld1q_u16(p), b = vld1q_u16(p + 8);
  F r;
  r.v[0] = bf16x4_to_f32(vget_low_u16(a));
  r.v[1] = bf16x4_to_f32(vget_high_u16(a));
  r.v[2] = bf16x4_to_f32(vget_low_u16(b));
  r.v[3] = bf16x4_to_f32(vget_high_u16(b));
  return r;
}
static inline F load_f16(const uint16_t* p) {
  uint16x8_t a = vld1q_u16(p), b = vld1q_u16(p + 8);
  F r;
  r.v[0] = f16x4_to_f32(vget_low_u16(a));
  r.v[1] = f16x4_to_f32(vget_high_u16(a));
  r.v[2] = f16x4_to_f32(vget_low_u16(b));
  r.v[3] = f16x4_to_f32(vget_high_u16(b));
  return r;
}
static inline uint16x4_t f32_to_bf16x4(float32x4_t v) {
  uint32x4_t x = vreinterpretq_u32_f32(v);
  uint32x4_t lsb = vandq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(1));
  uint32x4_t r = vshrq_n_u32(vaddq_u32(x, vaddq_u32(lsb, vdupq_n_u32(0x7FFF))), 16);
  uint32x4_t is_num = vceqq_f32(v, v);
  r = vbslq_u32(is_num, r, vdupq_n_u32(0x7FC0));
  return vmovn_u32(r);
}
static inline void store_bf16(uint16_t* p, F a) {
  for (int i = 0; i < 4; ++i) vst1_u16(p + 4 * i, f32_to_bf16x4(a.v[i]));
}
static inline void store_f16(uint16_t* p, F a) {
  for (int i = 0; i < 4; ++i) vst1_u16(p + 4 * i, vreinterpret_u16_f16(vcvt_f16_f32(a.v[i])));
}

static inline R load_raw(const uint16_t* p) {
  uint16x8x2_t a = vld2q_u16(p), b = vld2q_u16(p + 16);
  R r;
  r.lo[0] = a.val[0]; r.hi[0] = a.val[1];
  r.lo[1] = b.val[0]; r.hi[1] = b.val[1];
  return r;
}
static inline void split_bf16(R x, F& lo, F& hi) {
  for (int j = 0; j < 2; ++j) {
    lo.v[2 * j] = bf16x4_to_f32(vget_low_u16(x.lo[j]));
    lo.v[2 * j + 1] = bf16x4_to_f32(vget_high_u16(x.lo[j]));
    hi.v[2 * j] = bf16x4_to_f32(vget_low_u16(x.hi[j]));
    hi.v[2 * j + 1] = bf16x4_to_f32(vget_high_u16(x.hi[j]));
  }
}
static inline void split_f16(R x, F& lo, F& hi) {
  for (int j = 0; j < 2; ++j) {
    lo.v[2 * j] = f16x4_to_f32(vget_low_u16(x.lo[j]));
    lo.v[2 * j + 1] = f16x4_to_f32(vget_high_u16(x.lo[j]));
    hi.v[2 * j] = f16x4_to_f32(vget_low_u16(x.hi[j]));
    hi.v[2 * j + 1] = f16x4_to_f32(vget_high_u16(x.hi[j]));
  }
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
static inline F round_bf16(F a) {
  F r;
  for (int i = 0; i < 4; ++i) r.v[i] = bf16x4_to_f32(f32_to_bf16x4(a.v[i]));
  return r;
}
static inline F round_f16(F a) {
  F r;
  for (int i = 0; i < 4; ++i) r.v[i] = vcvt_f32_f16(vcvt_f16_f32(a.v[i]));
  return r;
}
#undef OCTAVO_NEON_MAP2

}  // namespace OCTAVO_ISA_NS
}  // namespace octavo
