// Weight-only INT8 / INT4 linear layers for batches of bf16 rows on AMX (Intel AMX-BF16).
// Included by quant_impl.h inside namespace octavo::OCTAVO_ISA_NS::quant; compiled only into the
// avx512_bf16 variant (OCTAVO_QUANT_AMX), used only where CPUID reports AMX-TILE and AMX-BF16 and
// the kernel grants this process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM).
//
// Per work item (a run of 32-channel weight tiles, handed out dynamically):
//   1. each tile's codes are dequantized ONCE into a per-thread buffer of bf16 (q - z) values in
//      AMX's pair layout (row r = k pairs 2r, 2r+1 of 32 channels: 64 bf16, 128 bytes); the
//      weight is read from memory as codes only (1 or 1/2 byte per weight), four tiles side by
//      side (four memory streams: one stream per core leaves the memory system idle);
//   2. for each block of up to 32 rows, per scale group: C = x[rows, group] . (q - z)[group]
//      accumulates in four 16x16 fp32 tiles (TDPBF16PS, 32 k per step), then y += s * C.
// Exactness: q - z is an integer of magnitude <= 255, exact in bf16, and bf16 products are exact
// in fp32, so this is the weight-only product x . ((q - z) * s) up to fp32 summation order --
// the same semantics as the GEMV/GEMM paths. Needs group % 32 == 0 or one group per row (then K
// is zero-padded to a multiple of 32, x included).

#if OCTAVO_QUANT_AMX

constexpr int kAmxK = 32;         // k per TDPBF16PS step (a B tile: 16 rows of k pairs)
constexpr int kAmxM = 32;         // rows per block (two A tiles of 16)
constexpr int kAmxMinRows = 5;    // below this the register-blocked GEMM/GEMV is faster
constexpr int64_t kAmxBufBytes = 512 << 10;  // dequantized tiles per work item (in L2)
#define OCTAVO_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

static bool amx_ready() { return amx::tiles_ready(); }

static inline bool amx_applies(const IntLinearArgs& a) {
  const IntWeights& w = a.w;
  return a.allow_amx && a.dtype == kBFloat16 && a.m >= kAmxMinRows &&
         (n_groups(w) == 1 || w.group % kAmxK == 0) && amx_ready();
}

struct AmxCtx {
  const IntLinearArgs* a;
  const uint16_t* x;   // bf16 rows, k32 usable columns (zero beyond K)
  int64_t xs;          // row stride of x in elements
  int64_t k32;         // K rounded up to 32
  int64_t tiles_per_item;
  int failed;
  const float* row_scale;  // [m] or null: y[i] *= row_scale[i] before the bias (int8 activations)
};

static void amx_configure(int mb) {
  const int r0 = mb < 16 ? mb : 16, r1 = mb - r0;
  const uint8_t rows[8] = {(uint8_t)r0, (uint8_t)r0, (uint8_t)r1, (uint8_t)r1,  // C00 C01 C10 C11
                           (uint8_t)r0, (uint8_t)r1, 16, 16};                   // A0 A1 B0 B1
  amx::configure(rows);
}

// rows [m0, m0 + mb) x one tile's 32 channels; bt: the tile's dequantized pairs
OCTAVO_AMX_TARGET static void amx_block(const AmxCtx& c, const uint16_t* bt, int64_t tile, int64_t m0, int mb) {
  const IntWeights& w = c.a->w;
  const int G = n_groups(w);
  const int64_t steps = (G == 1 ? c.k32 : w.group) / kAmxK, xsb = c.xs * 2;
  const uint16_t* x0 = c.x + m0 * c.xs;
  const uint16_t* x1 = x0 + 16 * c.xs;
  const float* st = w.scales + tile * (int64_t)G * kQuantTile;
  alignas(64) float cb[kAmxM * kQuantTile];
  alignas(64) float acc[kAmxM * kQuantTile];
  for (int g = 0; g < G; ++g) {
    _tile_zero(0); _tile_zero(1);
    if (mb > 16) { _tile_zero(2); _tile_zero(3); }
    for (int64_t s = g * steps; s < (g + 1) * steps; ++s) {
      _tile_loadd(6, bt + s * 16 * 64, 128);
      _tile_loadd(7, bt + s * 16 * 64 + 32, 128);
      _tile_loadd(4, x0 + s * kAmxK, xsb);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (mb > 16) {
        _tile_loadd(5, x1 + s * kAmxK, xsb);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, cb, 128); _tile_stored(1, cb + 16, 128);
    if (mb > 16) { _tile_stored(2, cb + 16 * kQuantTile, 128); _tile_stored(3, cb + 16 * kQuantTile + 16, 128); }
    const F s0 = load(st + g * kQuantTile), s1 = load(st + g * kQuantTile + 16);
    for (int i = 0; i < mb; ++i) {
      float* ai = acc + i * kQuantTile;
      const float* ci = cb + i * kQuantTile;
      store(ai, g == 0 ? mul(load(ci), s0) : fma(load(ci), s0, load(ai)));
      store(ai + 16, g == 0 ? mul(load(ci + 16), s1) : fma(load(ci + 16), s1, load(ai + 16)));
    }
  }
  for (int i = 0; i < mb; ++i) {
    F y0 = load(acc + i * kQuantTile), y1 = load(acc + i * kQuantTile + 16);
    if (c.row_scale) {
      const F r = bcast(c.row_scale[m0 + i]);
      y0 = mul(y0, r);
      y1 = mul(y1, r);
    }
    store_tile<kBFloat16>(*c.a, m0 + i, tile * kQuantTile, y0, y1);
  }
}

static thread_local TlsBuffer amx_pairs;  // this thread's dequantized tiles

template <int BITS>
OCTAVO_AMX_TARGET static void amx_item(void* ctx, int64_t item, int) {
  AmxCtx& c = *(AmxCtx*)ctx;
  const int64_t t0 = item * c.tiles_per_item, nt = n_tiles(c.a->w);
  const int64_t t1 = t0 + c.tiles_per_item < nt ? t0 + c.tiles_per_item : nt;
  const int64_t per_tile = c.k32 * 32;  // bf16 elements
  uint16_t* buf = (uint16_t*)amx_pairs.get((size_t)((t1 - t0) * per_tile * 2));
  if (!buf) { __atomic_store_n(&c.failed, 1, __ATOMIC_RELAXED); return; }
  for (int64_t t = t0; t < t1; t += kDequantStreams) {
    const int nb = t1 - t < kDequantStreams ? (int)(t1 - t) : kDequantStreams;
    dequant_pairs<BITS>(c.a->w, t, nb, c.k32, buf + (t - t0) * per_tile, per_tile);
  }
  __asm__ volatile("" ::: "memory");  // the tile loads (asm without a memory operand) read buf
  int configured = -1;
  for (int64_t m0 = 0; m0 < c.a->m; m0 += kAmxM) {
    const int mb = c.a->m - m0 < kAmxM ? (int)(c.a->m - m0) : kAmxM;
    if (mb != configured) { amx_configure(mb); configured = mb; }
    for (int64_t t = t0; t < t1; ++t) amx_block(c, buf + (t - t0) * per_tile, t, m0, mb);
  }
  _tile_release();
}

static thread_local TlsBuffer amx_xpad;  // x zero-padded to k32 columns, when K % 32 != 0

// row_scale: see AmxCtx (x then holds int8 codes as bf16, exact)
static const char* amx_linear(const IntLinearArgs& a, const float* row_scale = nullptr) {
  const int64_t k32 = (a.w.k + kAmxK - 1) / kAmxK * kAmxK;
  AmxCtx c{&a, (const uint16_t*)a.x, a.x_stride, k32, 1, 0, row_scale};
  if (k32 != a.w.k) {
    uint16_t* xp = (uint16_t*)amx_xpad.get((size_t)(a.m * k32 * 2));
    if (!xp) return "out of memory for the padded activations";
    for (int64_t i = 0; i < a.m; ++i) {
      memcpy(xp + i * k32, (const uint16_t*)a.x + i * a.x_stride, (size_t)a.w.k * 2);
      memset(xp + i * k32 + a.w.k, 0, (size_t)(k32 - a.w.k) * 2);
    }
    c.x = xp;
    c.xs = k32;
  }
  const int threads = threading::resolve_threads(a.num_threads);
  const int64_t nt = n_tiles(a.w), fit = kAmxBufBytes / (k32 * 64);
  int64_t per = nt / ((int64_t)threads * 2);
  per = per < 1 ? 1 : per > fit ? (fit < 1 ? 1 : fit) : per;
  c.tiles_per_item = per;
  const int64_t items = (nt + per - 1) / per;
  threading::parallel_run(items, items > 1 ? threads : 1, a.w.bits == 8 ? &amx_item<8> : &amx_item<4>, &c);
  return c.failed ? "out of memory for the dequantized weight tiles" : nullptr;
}

#endif  // OCTAVO_QUANT_AMX
