// Weight-only INT8 / INT4 linear layers for batches of bf16 rows on VDPBF16PS (AVX512-BF16, no
// AMX): the vector counterpart of quant_amx.h. Included by quant_impl.h inside namespace
// octavo::OCTAVO_ISA_NS::quant; compiled only into the avx512_bf16 variant (OCTAVO_QUANT_PAIRS),
// used for batches of at least IntLinearArgs::dp_min_rows rows (cpu_int.DPBF16_MIN_ROWS; 0: never).
//
// Per work item (a run of 32-channel weight tiles, an equal share per thread), per tile:
//   1. its codes were dequantized ONCE into one of two per-thread buffers of bf16 (q - z) pairs
//      (quant_pairs.h; 36 KiB per tile at K = 576, so it stays in L1 / L2), beside the previous
//      tile's first block of rows (the item's first tile on its own);
//   2. for each block of up to kDpRows rows, per scale group: acc += x[rows, 2r : 2r + 2] .
//      (q - z)[2r : 2r + 2] by VDPBF16PS (x's pair broadcast, 16 channels per instruction, fp32
//      sums), then y += s * acc in fp32 at the group's end; y is rounded once to bf16. The first
//      block also dequantizes the next tile, the second fetches the one after it into L2.
// Against the register-blocked fp32 GEMM this dequantizes every weight once per call instead of
// once per block of 8 rows, and each instruction does two multiply-adds per lane instead of one.
// Exactness: q - z is an integer of magnitude <= 255, exact in bf16, and x is bf16 already, so
// every product is exact; only the fp32 summation order (and VDPBF16PS flushing denormal sums to
// zero) differs from the reference x . ((q - z) * s) -- the AMX path's semantics. Needs one group
// per row or an even group (a pair never straddles two groups); K is padded to even (x included).

#if OCTAVO_QUANT_PAIRS

constexpr int kDpRows = 8;  // rows per register block (16 accumulators; y in L1 across groups)

static inline bool dp_applies(const IntLinearArgs& a) {
  const IntWeights& w = a.w;
  return a.dp_min_rows > 0 && a.m >= a.dp_min_rows && a.dtype == kBFloat16 &&
         (n_groups(w) == 1 || w.group % 2 == 0);
}

struct DpCtx {
  const IntLinearArgs* a;
  const uint16_t* x;  // bf16 rows, k2 usable columns (zero beyond K)
  int64_t xs;         // row stride of x in elements
  int64_t k2;         // K rounded up to even
  int64_t tiles_per_item;
  int failed;
};

static inline __m512bh x_pair(const uint16_t* p) {  // (x[k], x[k + 1]) in every 32-bit lane
  int32_t v;
  memcpy(&v, p, 4);
  return (__m512bh)_mm512_set1_epi32(v);
}

// The tile dequantized while the current one is multiplied (wp == nullptr: none): its codes,
// zero points and pair buffer; and the codes of the tile after it (nullptr: none), fetched into
// L2 a line per pair row during the second block of rows, so that the next tile's dequantization
// finds them there (the weight streams from memory spread over the product, as the bf16 GEMV's;
// without it every decoder linear of SmolLM2-135M, INT8 and INT4 g32 at 32 rows, took 1.09x the
// time).
struct NextTile {
  const uint8_t* wp;
  const float* zt;
  uint16_t* dst;
  const uint8_t* after;
};

// rows [m0, m0 + MR) x one tile's 32 channels; bt: the tile's dequantized pairs (k2 / 2 rows).
// FUSE: also dequantizes nx's pair rows [0, full), one beside each pair row of the product (the
// next tile's codes are read while this one's VDPBF16PS chain runs). pf: codes to fetch into
// L2, a line per pair row (NextTile::after).
template <int BITS, int MR, bool FUSE>
static void dp_block(const DpCtx& c, const uint16_t* bt, int64_t tile, int64_t m0, const NextTile& nx,
                     int64_t full, const uint8_t* pf) {
  const IntWeights& w = c.a->w;
  const int G = n_groups(w);
  const int64_t per_group = G == 1 ? c.k2 / 2 : w.group / 2;  // pair rows per group
  const int64_t row_bytes = BITS == 8 ? 2 * kQuantTile : kQuantTile, tile_bytes = k_rows(w) * kQuantTile;
  const float* st = w.scales + tile * (int64_t)G * kQuantTile;
  const uint16_t* x = c.x + m0 * c.xs;
  alignas(64) float y[MR][kQuantTile];
  for (int g = 0; g < G; ++g) {
    __m512 acc[MR][2];
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    F nz0 = zero(), nz1 = zero();
    if (FUSE) nz0 = magic_zero(load(nx.zt + g * kQuantTile)), nz1 = magic_zero(load(nx.zt + g * kQuantTile + 16));
    for (int64_t r = g * per_group; r < (g + 1) * per_group; ++r) {
      if (FUSE && r < full) {
        const int64_t ahead = r * row_bytes + kDequantPrefetch;
        if (ahead < tile_bytes) _mm_prefetch((const char*)nx.wp + ahead, _MM_HINT_T0);
        dequant_pair_row<BITS, true>(nx.wp, r, nz0, nz1, nx.dst + r * 64);
      }
      if (pf && r * 64 < tile_bytes) _mm_prefetch((const char*)pf + r * 64, _MM_HINT_T1);
      const __m512bh b0 = (__m512bh)_mm512_load_si512(bt + r * 64);
      const __m512bh b1 = (__m512bh)_mm512_load_si512(bt + r * 64 + 32);
      for (int i = 0; i < MR; ++i) {
        const __m512bh xp = x_pair(x + i * c.xs + 2 * r);
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xp, b0);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xp, b1);
      }
    }
    const __m512 s0 = _mm512_loadu_ps(st + g * kQuantTile), s1 = _mm512_loadu_ps(st + g * kQuantTile + 16);
    for (int i = 0; i < MR; ++i) {  // y += s * acc, in fp32 (L1) across groups
      _mm512_store_ps(y[i], g == 0 ? _mm512_mul_ps(acc[i][0], s0) : _mm512_fmadd_ps(acc[i][0], s0, _mm512_load_ps(y[i])));
      _mm512_store_ps(y[i] + 16, g == 0 ? _mm512_mul_ps(acc[i][1], s1) : _mm512_fmadd_ps(acc[i][1], s1, _mm512_load_ps(y[i] + 16)));
    }
  }
  for (int i = 0; i < MR; ++i) store_tile<kBFloat16>(*c.a, m0 + i, tile * kQuantTile, load(y[i]), load(y[i] + 16));
}

// The next tile (if any) into its pair buffer, without a product to hide in.
template <int BITS>
static void dp_dequant(const IntWeights& w, const NextTile& nx, int64_t tile, int64_t k2, int64_t per_tile) {
  if (nx.wp) dequant_pairs<BITS>(w, tile, 1, k2, nx.dst, per_tile);
}

// every row of the call x one tile, in blocks of kDpRows rows and then the rest (< kDpRows). The
// first full block also dequantizes the next tile (nx, tile + 1), else that runs on its own.
// Measured alternatives (SmolLM2-135M decoder linears, INT8, 32 rows, 2-core Zen 5, same process):
// four tiles dequantized apart before their products (and by a rounding conversion) ~1.05x the
// time; the next tile spread over all four blocks (a quarter of its pair rows in each) 1.12x.
// The conversions compete with VDPBF16PS for the vector pipes wherever they run; beside the
// first block the codes' memory latency is hidden.
template <int BITS>
static void dp_tile(const DpCtx& c, const uint16_t* bt, int64_t tile, const NextTile& nx) {
  const IntWeights& w = c.a->w;
  const int64_t m = c.a->m, full = BITS == 8 ? w.k / 2 : (w.k + 1) / 2;  // pair rows with both k real
  const int64_t blocks = m / kDpRows;
  if (!blocks) dp_dequant<BITS>(w, nx, tile + 1, c.k2, c.k2 * kQuantTile);
  int64_t m0 = 0;
  for (int64_t b = 0; b < blocks; ++b, m0 += kDpRows) {
    const uint8_t* pf = b == (blocks > 1 ? 1 : 0) ? nx.after : nullptr;
    if (b == 0 && nx.wp) dp_block<BITS, kDpRows, true>(c, bt, tile, m0, nx, full, pf);
    else dp_block<BITS, kDpRows, false>(c, bt, tile, m0, nx, 0, pf);
  }
  if (blocks && nx.wp && full < c.k2 / 2) {  // 8-bit, odd K: the last pair's second k is padding
    const float* zl = nx.zt + (int64_t)(n_groups(w) - 1) * kQuantTile;
    dequant_pair_row<BITS, false>(nx.wp, full, magic_zero(load(zl)), magic_zero(load(zl + 16)), nx.dst + full * 64);
  }
  switch (m - m0) {
#define OCTAVO_DP_REST(r) \
  case r: if constexpr (r < kDpRows) dp_block<BITS, (r < kDpRows ? r : 1), false>(c, bt, tile, m0, nx, 0, nullptr); break;
    OCTAVO_DP_REST(1) OCTAVO_DP_REST(2) OCTAVO_DP_REST(3) OCTAVO_DP_REST(4)
    OCTAVO_DP_REST(5) OCTAVO_DP_REST(6) OCTAVO_DP_REST(7)
#undef OCTAVO_DP_REST
    default: break;
  }
}

static thread_local TlsBuffer dp_pairs;  // this thread's two dequantized tiles (current, next)
// bf16 elements between the two buffers beyond a tile: a tile is a multiple of 4 KiB at common K
// (576: 36 KiB), so without it the next tile's stores and this one's loads alias in the low 12
// address bits pair row for pair row
constexpr int64_t kDpSkew = 256;

template <int BITS>
static void dp_item(void* ctx, int64_t item, int) {
  DpCtx& c = *(DpCtx*)ctx;
  const IntWeights& w = c.a->w;
  const int64_t t0 = item * c.tiles_per_item, nt = n_tiles(w);
  const int64_t t1 = t0 + c.tiles_per_item < nt ? t0 + c.tiles_per_item : nt;
  const int64_t per_tile = c.k2 * kQuantTile, G = n_groups(w);  // bf16 elements
  uint16_t* buf = (uint16_t*)dp_pairs.get((size_t)((2 * per_tile + kDpSkew) * 2));
  if (!buf) { __atomic_store_n(&c.failed, 1, __ATOMIC_RELAXED); return; }
  uint16_t *cur = buf, *next = buf + per_tile + kDpSkew;
  dequant_pairs<BITS>(w, t0, 1, c.k2, cur, per_tile);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t tile_bytes = k_rows(w) * kQuantTile;
    NextTile nx{nullptr, nullptr, next, nullptr};
    if (t + 1 < t1) nx = {w.weight + (t + 1) * tile_bytes, w.zeros + (t + 1) * G * kQuantTile, next, nullptr};
    if (t + 2 < t1) nx.after = w.weight + (t + 2) * tile_bytes;
    dp_tile<BITS>(c, cur, t, nx);
    uint16_t* done = cur;
    cur = next;
    next = done;
  }
}

static thread_local TlsBuffer dp_xpad;  // x zero-padded to an even number of columns, when K is odd

static const char* dp_linear(const IntLinearArgs& a) {
  const int64_t k2 = (a.w.k + 1) & ~(int64_t)1;
  DpCtx c{&a, (const uint16_t*)a.x, a.x_stride, k2, 1, 0};
  if (k2 != a.w.k) {
    uint16_t* xp = (uint16_t*)dp_xpad.get((size_t)(a.m * k2 * 2));
    if (!xp) return "out of memory for the padded activations";
    for (int64_t i = 0; i < a.m; ++i) {
      memcpy(xp + i * k2, (const uint16_t*)a.x + i * a.x_stride, (size_t)a.w.k * 2);
      xp[i * k2 + a.w.k] = 0;
    }
    c.x = xp;
    c.xs = k2;
  }
  const int threads = threading::resolve_threads(a.num_threads);
  const int64_t nt = n_tiles(a.w);
  // one item per thread, an equal share of whole tiles: an item's first tile is dequantized on
  // its own (runs of <= 16 tiles, as batch 1 takes them: 1.015x the time, decoder linears of
  // SmolLM2-135M, INT8, 32 rows)
  c.tiles_per_item = (nt + threads - 1) / threads;
  const int64_t items = (nt + c.tiles_per_item - 1) / c.tiles_per_item;
  threading::parallel_run(items, items > 1 ? threads : 1, a.w.bits == 8 ? &dp_item<8> : &dp_item<4>, &c);
  return c.failed ? "out of memory for the dequantized weight tiles" : nullptr;
}

#endif  // OCTAVO_QUANT_PAIRS
