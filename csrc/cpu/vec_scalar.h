// Portable scalar vector layer: a logical 16-float vector is a plain array (compilers may
// auto-vectorise it for the baseline ISA, never beyond it).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "scalar_convert.h"

namespace octavo {
namespace OCTAVO_ISA_NS {

constexpr const char* kIsaName = "scalar";
constexpr bool kHasBf16Dot = false;
constexpr int kQkAcc = 8;  // Q.K^T accumulators (rows x token groups)
constexpr int kQkRows = 4;
constexpr int kPvRows = 2;
constexpr int kPvCols = 2;

struct F { float v[16]; };
struct R { uint32_t v[16]; };

#define OCTAVO_SCALAR_MAP(expr) \
  F r; for (int i = 0; i < 16; ++i) r.v[i] = (expr); return r

static inline F zero() { OCTAVO_SCALAR_MAP(0.f); }
static inline F bcast(float x) { OCTAVO_SCALAR_MAP(x); }
static inline F load(const float* p) { OCTAVO_SCALAR_MAP(p[i]); }
static inline void store(float* p, F a) { for (int i = 0; i < 16; ++i) p[i] = a.v[i]; }
static inline F add(F a, F b) { OCTAVO_SCALAR_MAP(a.v[i] + b.v[i]); }
static inline F sub(F a, F b) { OCTAVO_SCALAR_MAP(a.v[i] - b.v[i]); }
static inline F mul(F a, F b) { OCTAVO_SCALAR_MAP(a.v[i] * b.v[i]); }
static inline F div(F a, F b) { OCTAVO_SCALAR_MAP(a.v[i] / b.v[i]); }
static inline F max(F a, F b) { OCTAVO_SCALAR_MAP(a.v[i] > b.v[i] ? a.v[i] : b.v[i]); }
static inline F min(F a, F b) { OCTAVO_SCALAR_MAP(a.v[i] < b.v[i] ? a.v[i] : b.v[i]); }
static inline F fma(F a, F b, F c) { OCTAVO_SCALAR_MAP(a.v[i] * b.v[i] + c.v[i]); }
static inline float hmax(F a) { float m = a.v[0]; for (int i = 1; i < 16; ++i) m = a.v[i] > m ? a.v[i] : m; return m; }
static inline float hsum(F a) { float s = 0.f; for (int i = 0; i < 16; ++i) s += a.v[i]; return s; }
static inline F round_nearest(F a) { OCTAVO_SCALAR_MAP(nearbyintf(a.v[i])); }
static inline float pow2i1(float n) {
  uint32_t b = (uint32_t)((int32_t)n + 127) << 23;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static inline F pow2i(F n) { OCTAVO_SCALAR_MAP(pow2i1(n.v[i])); }

static inline F load_bf16(const uint16_t* p) { OCTAVO_SCALAR_MAP(bf16_bits_to_f32(p[i])); }
static inline F load_f16(const uint16_t* p) { OCTAVO_SCALAR_MAP(f16_bits_to_f32(p[i])); }
static inline void store_bf16(uint16_t* p, F a) { for (int i = 0; i < 16; ++i) p[i] = f32_to_bf16_bits(a.v[i]); }
static inline void store_f16(uint16_t* p, F a) { for (int i = 0; i < 16; ++i) p[i] = f32_to_f16_bits(a.v[i]); }

static inline R load_raw(const uint16_t* p) {
  R r;
  for (int i = 0; i < 16; ++i) r.v[i] = (uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 16);
  return r;
}
static inline void split_bf16(R x, F& lo, F& hi) {
  for (int i = 0; i < 16; ++i) { lo.v[i] = bf16_bits_to_f32(x.v[i] & 0xFFFF); hi.v[i] = bf16_bits_to_f32(x.v[i] >> 16); }
}
static inline void split_f16(R x, F& lo, F& hi) {
  for (int i = 0; i < 16; ++i) { lo.v[i] = f16_bits_to_f32(x.v[i] & 0xFFFF); hi.v[i] = f16_bits_to_f32(x.v[i] >> 16); }
}
static inline F dot_bf16_pair(F acc, R b, uint32_t a) {
  F lo, hi;
  split_bf16(b, lo, hi);
  return fma(hi, bcast(bf16_bits_to_f32(a >> 16)), fma(lo, bcast(bf16_bits_to_f32(a & 0xFFFF)), acc));
}

// Round to bf16 / fp16 and back (round to nearest even, like torch).
static inline F round_bf16(F a) { F r; for (int i = 0; i < 16; ++i) r.v[i] = bf16_bits_to_f32(f32_to_bf16_bits(a.v[i])); return r; }
static inline F round_f16(F a) { F r; for (int i = 0; i < 16; ++i) r.v[i] = f16_bits_to_f32(f32_to_f16_bits(a.v[i])); return r; }
#undef OCTAVO_SCALAR_MAP

}  // namespace OCTAVO_ISA_NS
}  // namespace octavo
