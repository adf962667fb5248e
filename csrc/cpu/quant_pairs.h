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

// Codes to exact (q - z) without a conversion instruction: the float whose bits are
// 0x4B000000 | q is 2^23 + q (q < 2^23), so one subtraction of zm = z + 2^23 gives q - z exactly.
constexpr float kMagic = 8388608.f;  // 2^23
static inline F magic_zero(F z) { return add(z, bcast(kMagic)); }
static inline F minus_zero(__m512i q, F zm) {
  return {_mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(q, _mm512_set1_epi32(0x4B000000))), zm.v)};
}

// dst[2i] = bf16(even[i]), dst[2i+1] = bf16(odd[i]) for integers of at most 8 significant bits
// (|q - z| <= 255), whose fp32 low 16 bits are zero: bf16 is the high half, exactly (two integer
// ops instead of a rounding conversion and a word permutation)
static inline void put_pairs(uint16_t* dst, F even, F odd) {
  const __m512i e = _mm512_castps_si512(even.v), o = _mm512_castps_si512(odd.v);
  _mm512_storeu_si512(dst, _mm512_or_si512(o, _mm512_srli_epi32(e, 16)));
}

static inline __m512i widen16(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }

// One pair row r of one tile: (q - z) of k = 2r, 2r + 1 for its 32 channels, 64 bf16 at dst;
// z0, z1: the row's zero points plus 2^23 (magic_zero; channels 0-15, 16-31). !FULL: 8-bit, the
// pair's second k is padding past an odd K (x is 0 there): 0.
template <int BITS, bool FULL>
static inline void dequant_pair_row(const uint8_t* wp, int64_t r, F z0, F z1, uint16_t* dst) {
  if constexpr (BITS == 8) {
    const uint8_t* p0 = wp + 2 * r * kQuantTile;
    put_pairs(dst, minus_zero(widen16(p0), z0), FULL ? minus_zero(widen16(p0 + 32), z0) : zero());
    put_pairs(dst + 32, minus_zero(widen16(p0 + 16), z1), FULL ? minus_zero(widen16(p0 + 48), z1) : zero());
  } else {  // a byte holds k = 2r (low nibble) and 2r + 1 (high nibble) of one channel
    const __m512i b0 = widen16(wp + r * kQuantTile), b1 = widen16(wp + r * kQuantTile + 16);
    const __m512i m = _mm512_set1_epi32(15);
    put_pairs(dst, minus_zero(_mm512_and_si512(b0, m), z0), minus_zero(_mm512_srli_epi32(b0, 4), z0));
    put_pairs(dst + 32, minus_zero(_mm512_and_si512(b1, m), z1), minus_zero(_mm512_srli_epi32(b1, 4), z1));
  }
}

constexpr int kDequantStreams = 4;  // tiles dequantized side by side
constexpr int64_t kDequantPrefetch = 1024;  // bytes ahead in each tile's codes

// Pair rows [r0, r1) of nb tiles side by side, each row prefetching its stream's codes ahead.
template <int BITS, bool FULL>
static inline void dequant_rows(const uint8_t* const* wp, const F (*z)[2], int nb, int64_t r0, int64_t r1,
                                int64_t tile_bytes, uint16_t* dst, int64_t per_tile) {
  const int64_t row_bytes = BITS == 8 ? 2 * kQuantTile : kQuantTile;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t ahead = r * row_bytes + kDequantPrefetch;
    for (int i = 0; i < nb; ++i) {
      if (ahead < tile_bytes) _mm_prefetch((const char*)wp[i] + ahead, _MM_HINT_T0);  // a line per row or two
      dequant_pair_row<BITS, FULL>(wp[i], r, z[i][0], z[i][1], dst + i * per_tile + r * 64);
    }
  }
}

// Tiles [t0, t0 + nb) (nb <= kDequantStreams) into their (q - z) pair layouts, k_pad / 2 rows of
// 64 bf16 each (channels 0-15 pairs, 16-31 pairs), tile i at dst + i * per_tile. The tiles are
// walked row by row in lock-step: one sequential stream per tile keeps several memory streams
// in flight (one stream per core leaves the memory system idle between prefetches; this is
// the part of the layer that reads the weight). Zero points are loaded once per group.
template <int BITS>
static void dequant_pairs(const IntWeights& w, int64_t t0, int nb, int64_t k_pad, uint16_t* dst, int64_t per_tile) {
  const int64_t nrows = k_rows(w), real_pairs = (w.k + 1) / 2, G = n_groups(w);
  const int64_t full_pairs = BITS == 8 ? w.k / 2 : real_pairs;  // pairs with both k real
  const int64_t per_group = G == 1 ? real_pairs : w.group / 2;
  const uint8_t* wp[kDequantStreams];
  for (int i = 0; i < nb; ++i) wp[i] = w.weight + (t0 + i) * nrows * kQuantTile;
  for (int64_t g = 0; g < G; ++g) {
    F z[kDequantStreams][2];
    for (int i = 0; i < nb; ++i) {
      const float* zg = w.zeros + ((t0 + i) * G + g) * kQuantTile;
      z[i][0] = magic_zero(load(zg));
      z[i][1] = magic_zero(load(zg + 16));
    }
    const int64_t r0 = g * per_group, r1 = r0 + per_group < real_pairs ? r0 + per_group : real_pairs;
    const int64_t rf = r1 < full_pairs ? r1 : full_pairs;
    dequant_rows<BITS, true>(wp, z, nb, r0, rf, nrows * kQuantTile, dst, per_tile);
    dequant_rows<BITS, false>(wp, z, nb, rf, r1, nrows * kQuantTile, dst, per_tile);
  }
  for (int i = 0; i < nb; ++i)
    memset(dst + i * per_tile + real_pairs * 64, 0, (size_t)(k_pad / 2 - real_pairs) * 128);
}

#endif  // OCTAVO_QUANT_PAIRS
