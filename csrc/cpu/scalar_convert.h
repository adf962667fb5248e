// Scalar 16-bit float conversions (bit exact: round to nearest even, as torch rounds).
// static inline: internal linkage, so every ISA's translation unit keeps its own copy.
#pragma once
#include <stdint.h>
#include <string.h>

static inline float bf16_bits_to_f32(uint32_t h) { uint32_t b = h << 16; float f; memcpy(&f, &b, 4); return f; }
static inline float f16_bits_to_f32(uint32_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, b;
  if (exp == 0) {
    if (man == 0) {
      b = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; man <<= 1; } while (!(man & 0x400));
      b = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    b = sign | 0x7F800000u | (man << 13);
  } else {
    b = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if (f != f) return 0x7FC0;
  return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}
static inline uint16_t f32_to_f16_bits(float f) {  // round to nearest even
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);             // NaN
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);            // overflow -> inf
  if (ax < 0x38800000u) {                                              // subnormal or zero
    if (ax < 0x33000000u) return (uint16_t)sign;                       // < 2^-25 -> 0
    uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((ax >> 13) - (112u << 10));
  uint32_t rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) ++r;
  return (uint16_t)(sign | r);
}

