// The bf16 pair layout of dequantized weight tiles, shared by the AMX kernel (quant_amx.h) and
// the VDPBF16PS kernel (quant_dpbf16.h). Included by quant_impl.h inside namespace
// octavo::OCTAVO_ISA_NS::quant; compiled only into the avx512_bf16 variant (OCTAVO_QUANT_PAIRS).
//
// A tile's (q - z) values as k_pad / 2 pair rows of 64 bf16 (128 bytes): row r holds channels
// 0-15 then 16-31, each channel as the pair (k = 2r, k = 2r + 1) in one 32-bit lane -- both
// AMX's B-operand layout and VDPBF16PS's. q - z is an integer of magnitude <= 255, exact in
// bf16; the scale stays fp32 (applied per group by the caller). The weight is read from memory
// as codes only.

#if OCTAVO_QUANT_PAIRS

// dst[2i] = bf16(even[i]), dst[2i+1] = bf16(odd[i]); exact for the integers (q - z)
static inline void put_pairs(uint16_t* dst, F even, F odd) {
  static const uint16_t kIdx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i t = (__m512i)_mm512_cvtne2ps_pbh(odd.v, even.v);  // [even | odd]
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(_mm512_loadu_si512(kIdx), t));
}

// One pair row r of one tile: (q - z) of k = 2r, 2r + 1 for its 32 channels, 64 bf16 at dst;
// g: the row's scale group.
template <int BITS>
static inline void dequant_pair_row(const IntWeights& w, const uint8_t* wp, const float* zt, int64_t r,
                                    int64_t g, uint16_t* dst) {
  const F z0 = load(zt + g * kQuantTile), z1 = load(zt + g * kQuantTile + 16);
  if constexpr (BITS == 8) {
    const uint8_t* p0 = wp + 2 * r * kQuantTile;
    const bool odd = 2 * r + 1 < w.k;  // else the pair's second k is padding (x is 0 there)
    put_pairs(dst, sub(codes8(p0), z0), odd ? sub(codes8(p0 + 32), z0) : zero());
    put_pairs(dst + 32, sub(codes8(p0 + 16), z1), odd ? sub(codes8(p0 + 48), z1) : zero());
  } else {
    F l0, h0, l1, h1;
    codes4(wp + r * kQuantTile, l0, h0);
    codes4(wp + r * kQuantTile + 16, l1, h1);
    put_pairs(dst, sub(l0, z0), sub(h0, z0));
    put_pairs(dst + 32, sub(l1, z1), sub(h1, z1));
  }
}

constexpr int kDequantStreams = 4;  // tiles dequantized side by side
constexpr int64_t kDequantPrefetch = 1024;  // bytes ahead in each tile's codes

// Tiles [t0, t0 + nb) (nb <= kDequantStreams) into their (q - z) pair layouts, k_pad / 2 rows of
// 64 bf16 each (channels 0-15 pairs, 16-31 pairs), tile i at dst + i * per_tile. The tiles are
// walked row by row in lock-step: one sequential stream per tile keeps several memory streams
// in flight (one stream per core leaves the memory system idle between prefetches; this is
// the part of the layer that reads the weight).
template <int BITS>
static void dequant_pairs(const IntWeights& w, int64_t t0, int nb, int64_t k_pad, uint16_t* dst, int64_t per_tile) {
  const int64_t nrows = k_rows(w), real_pairs = (w.k + 1) / 2, G = n_groups(w);
  const uint8_t* wp[kDequantStreams];
  const float* zt[kDequantStreams];
  for (int i = 0; i < nb; ++i) {
    wp[i] = w.weight + (t0 + i) * nrows * kQuantTile;
    zt[i] = w.zeros + (t0 + i) * G * kQuantTile;
  }
  const int64_t row_bytes = BITS == 8 ? 2 * kQuantTile : kQuantTile, tile_bytes = nrows * kQuantTile;
  for (int64_t r = 0; r < real_pairs; ++r) {
    const int64_t g = G == 1 ? 0 : r / (w.group / 2), ahead = r * row_bytes + kDequantPrefetch;
    for (int i = 0; i < nb; ++i) {
      if (ahead < tile_bytes) _mm_prefetch((const char*)wp[i] + ahead, _MM_HINT_T0);  // a line per row or two
      dequant_pair_row<BITS>(w, wp[i], zt[i], r, g, dst + i * per_tile + r * 64);
    }
  }
  for (int i = 0; i < nb; ++i)
    memset(dst + i * per_tile + real_pairs * 64, 0, (size_t)(k_pad / 2 - real_pairs) * 128);
}

#endif  // OCTAVO_QUANT_PAIRS
