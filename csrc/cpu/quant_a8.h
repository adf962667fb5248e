// INT8 / INT4 linear layers with int8 activations (W8A8 / W4A8 numerics) on AVX512-VNNI.
// Included by quant_impl.h inside namespace octavo::OCTAVO_ISA_NS::quant; compiled into the AVX-512
// variants on x86-64 (OCTAVO_QUANT_A8), used only where CPUID reports AVX512-VNNI and AVX512-VBMI.
//
// Semantics (the torch reference: octavo/quantization/kernels/torch_ref.py, int_a8_linear):
//   per row of x: s = input_scale if > 0 else max(amax(|x|) / 127.5, 1e-12) (compressed-tensors'
//   symmetric convention), xq = clamp(round_half_even(x / s), -128, 127) (fp32 division);
//   per 32-channel tile and scale group g: the EXACT integer d_g = sum_k (q - z_g) xq (int32;
//   q - z is formed as sum q xq - z sum xq), then y = s * sum_g w_scale_g * float(d_g) (+ bias).
//   Only the fp32 epilogue rounds.
// Loop: per 4 k, the tile's 4 x 32 codes (128 bytes: 8-bit rows k..k+3, or 4-bit rows r, r+1
// with their nibbles split) are regrouped into two registers of 16 channels x 4 consecutive k
// by VPERMT2B, and each row's 4 activation bytes (broadcast) meet them in VPDPBUSD (u8 x s8).
// Rows are processed in blocks of up to kA8Rows (8) sharing every regrouped weight register;
// a single row streams kGemvTiles tiles side by side instead (a8_block's NT).
// Needs K % 4 == 0, group % 4 == 0 (or one group per row) and group <= kA8MaxGroup (int32 headroom:
// 255 * 128 * group < 2^31).

#if OCTAVO_QUANT_A8

constexpr int kA8Rows = 8;
constexpr int64_t kA8MaxGroup = 65536;
#define OCTAVO_A8_TARGET __attribute__((target("avx512vnni,avx512vbmi")))

// AVX512-VNNI and AVX512-VBMI present (CPUID leaf 7: ECX bits 11 and 1); the AVX-512 state
// itself was checked when this variant was chosen.
static bool a8_ready() {
  static int state = -1;
  if (state < 0) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    state = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11)) && (c & (1u << 1));
  }
  return state == 1;
}

static const char* a8_unsupported(const IntLinearArgs& a) {
  const IntWeights& w = a.w;
  if (!a8_ready()) return "int8 activations need a CPU with AVX512-VNNI and AVX512-VBMI";
  if (w.k % 4 || (n_groups(w) > 1 && w.group % 4)) return "int8 activations need K and the group a multiple of 4";
  if (w.group > kA8MaxGroup) return "int8 activations need a group of at most 65536 (int32 sums)";
  return nullptr;
}

// acc + u8 . s8 (VPDPBUSD). GCC 12 keeps _mm512_dpbusd_epi32's accumulators in zmm16-31 but
// computes in zmm0-15, so the k loop copied every accumulator out and back and spilled (perf
// annotate: ~30 register moves per 16 VPDPBUSD); the asm operand takes any of the 32 registers.
OCTAVO_A8_TARGET static inline __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8) {
#if defined(__GNUC__) && !defined(__clang__)
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
  return acc;
#else
  return _mm512_dpbusd_epi32(acc, u8, s8);
#endif
}

struct A8Ctx {
  const IntLinearArgs* a;
  const int8_t* xq;    // [m][K]
  const float* xs;     // [m] activation scales
  const int32_t* xsum; // [m][G] sums of xq per group
  int64_t tiles_per_item;
  alignas(64) uint8_t idx[2][64];  // a8_index
};

// Byte 4c + j of output register `half` = channel (16 half + c)'s code at the quad's k + j, from the
// sources A (bytes 0..63) and B (64..127). 8-bit: A = rows k, k+1, B = rows k+2, k+3; 4-bit:
// A = low nibbles (k, k+2), B = high nibbles (k+1, k+3).
static void a8_index(int bits, uint8_t (&idx)[2][64]) {
  const int j1 = bits == 8 ? 32 : 64, j2 = bits == 8 ? 64 : 32;
  for (int ch = 0; ch < 32; ++ch) {
    uint8_t* o = idx[ch / 16] + 4 * (ch % 16);
    o[0] = (uint8_t)ch;
    o[1] = (uint8_t)(j1 + ch);
    o[2] = (uint8_t)(j2 + ch);
    o[3] = (uint8_t)(96 + ch);
  }
}

// Rows [m0, m0 + MR) x tiles [tile0, tile0 + NT): the MR rows share every regrouped weight
// register (batches: NT = 1); the NT tiles are NT memory streams per core (one row: MR = 1,
// as gemv_tiles). pf (batches): the next tile's codes, fetched into L2 beside this product, the
// bytes of one k quad per k quad (its first row block reads the tile from memory otherwise, at
// the latency of each line: the hardware prefetcher does not cross to the next tile).
template <int DT, int BITS, int MR, int NT>
OCTAVO_A8_TARGET static void a8_block(const A8Ctx& c, int64_t tile0, int64_t m0, const uint8_t* pf = nullptr) {
  const IntWeights& w = c.a->w;
  const int G = n_groups(w);
  const int64_t K = w.k, tile_stride = k_rows(w) * kQuantTile, sz_stride = (int64_t)G * kQuantTile;
  const uint8_t* wp = w.weight + tile0 * tile_stride;
  const float* s = w.scales + tile0 * sz_stride;
  const float* z = w.zeros + tile0 * sz_stride;
  const __m512i i0 = _mm512_load_si512(c.idx[0]), i1 = _mm512_load_si512(c.idx[1]), nib = _mm512_set1_epi8(15);
  const int8_t* xr[MR];
  for (int i = 0; i < MR; ++i) xr[i] = c.xq + (m0 + i) * K;
  // y: the fp32 sums across groups, in L1 (in registers they would add 2 MR NT live vectors to
  // the accumulators, more than the 32 the k loop can hold: the compiler spilled inside it).
  alignas(64) float y[MR][NT][kQuantTile];
  for (int g = 0; g < G; ++g) {
    const int64_t k0 = (int64_t)g * w.group, k1 = k0 + w.group;
    __m512i acc[MR][NT][2];
    for (int i = 0; i < MR; ++i)
      for (int t = 0; t < NT; ++t) acc[i][t][0] = acc[i][t][1] = _mm512_setzero_si512();
    if (MR == 1) prefetch_scales<NT>(s, z, sz_stride, g, G, w.zero_point < 0.f);
    for (int64_t k = k0; k < k1; k += 4) {
      if (MR > 1 && pf) {
        _mm_prefetch((const char*)pf + (BITS == 8 ? k : k / 2) * kQuantTile, _MM_HINT_T1);
        if (BITS == 8) _mm_prefetch((const char*)pf + k * kQuantTile + 64, _MM_HINT_T1);
      }
      for (int t = 0; t < NT; ++t) {
        const uint8_t* wt = wp + t * tile_stride;
        if (MR == 1) __builtin_prefetch(wt + (BITS == 8 ? k : k / 2) * kQuantTile + kGemvPrefetch);
        __m512i A, B;
        if constexpr (BITS == 8) {
          A = _mm512_loadu_si512(wt + k * kQuantTile);
          B = _mm512_loadu_si512(wt + (k + 2) * kQuantTile);
        } else {
          const __m512i p = _mm512_loadu_si512(wt + (k / 2) * kQuantTile);
          A = _mm512_and_si512(p, nib);
          B = _mm512_and_si512(_mm512_srli_epi16(p, 4), nib);
        }
        const __m512i w0 = _mm512_permutex2var_epi8(A, i0, B), w1 = _mm512_permutex2var_epi8(A, i1, B);
        for (int i = 0; i < MR; ++i) {
          int32_t q4;
          memcpy(&q4, xr[i] + k, 4);
          const __m512i xb = _mm512_set1_epi32(q4);
          acc[i][t][0] = dpbusd(acc[i][t][0], w0, xb);
          acc[i][t][1] = dpbusd(acc[i][t][1], w1, xb);
        }
      }
    }
    // exact d = sum q xq - z sum xq (z is an integer code), then y += w_scale * float(d)
    for (int t = 0; t < NT; ++t) {
      const float* zg = z + t * sz_stride + g * kQuantTile;
      const float* sg = s + t * sz_stride + g * kQuantTile;
      const bool zc = w.zero_point >= 0.f;  // a constant zero point: not streamed
      const __m512i z0 = _mm512_cvtps_epi32(zc ? _mm512_set1_ps(w.zero_point) : _mm512_loadu_ps(zg));
      const __m512i z1 = _mm512_cvtps_epi32(zc ? _mm512_set1_ps(w.zero_point) : _mm512_loadu_ps(zg + 16));
      const __m512 s0 = _mm512_loadu_ps(sg), s1 = _mm512_loadu_ps(sg + 16);
      for (int i = 0; i < MR; ++i) {
        const __m512i xsg = _mm512_set1_epi32(c.xsum[(m0 + i) * G + g]);
        const __m512i d0 = _mm512_sub_epi32(acc[i][t][0], _mm512_mullo_epi32(z0, xsg));
        const __m512i d1 = _mm512_sub_epi32(acc[i][t][1], _mm512_mullo_epi32(z1, xsg));
        float* yt = y[i][t];
        _mm512_store_ps(yt, g == 0 ? _mm512_mul_ps(s0, _mm512_cvtepi32_ps(d0))
                                   : _mm512_fmadd_ps(s0, _mm512_cvtepi32_ps(d0), _mm512_load_ps(yt)));
        _mm512_store_ps(yt + 16, g == 0 ? _mm512_mul_ps(s1, _mm512_cvtepi32_ps(d1))
                                        : _mm512_fmadd_ps(s1, _mm512_cvtepi32_ps(d1), _mm512_load_ps(yt + 16)));
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    const __m512 sx = _mm512_set1_ps(c.xs[m0 + i]);
    for (int t = 0; t < NT; ++t)
      store_tile<DT>(*c.a, m0 + i, (tile0 + t) * kQuantTile, F{_mm512_mul_ps(_mm512_load_ps(y[i][t]), sx)},
                     F{_mm512_mul_ps(_mm512_load_ps(y[i][t] + 16), sx)});
  }
}

template <int DT, int BITS>
OCTAVO_A8_TARGET static void a8_item(void* ctx, int64_t item, int) {
  const A8Ctx& c = *(const A8Ctx*)ctx;
  const int64_t t0 = item * c.tiles_per_item, nt = n_tiles(c.a->w), m = c.a->m;
  const int64_t t1 = t0 + c.tiles_per_item < nt ? t0 + c.tiles_per_item : nt;
  if (m == 1) {
    tile_passes(t0, t1, [&](auto n, int64_t t) { a8_block<DT, BITS, 1, decltype(n)::value>(c, t, 0); });
    return;
  }
  const IntWeights& w = c.a->w;
  const int64_t tile_stride = k_rows(w) * kQuantTile;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* next = t + 1 < t1 ? w.weight + (t + 1) * tile_stride : nullptr;
    int64_t m0 = 0;
    for (; m0 + kA8Rows <= m; m0 += kA8Rows) a8_block<DT, BITS, kA8Rows, 1>(c, t, m0, m0 ? nullptr : next);
    const uint8_t* pf = m0 ? nullptr : next;  // fewer rows than a block: the remainder prefetches
    switch (m - m0) {
      case 1: a8_block<DT, BITS, 1, 1>(c, t, m0); break;
      case 2: a8_block<DT, BITS, 2, 1>(c, t, m0, pf); break;
      case 3: a8_block<DT, BITS, 3, 1>(c, t, m0, pf); break;
      case 4: a8_block<DT, BITS, 4, 1>(c, t, m0, pf); break;
      case 5: a8_block<DT, BITS, 5, 1>(c, t, m0, pf); break;
      case 6: a8_block<DT, BITS, 6, 1>(c, t, m0, pf); break;
      case 7: a8_block<DT, BITS, 7, 1>(c, t, m0, pf); break;
      default: break;
    }
  }
}

// One row of x -> int8 codes, its scale, and the per-group sums of the codes.
template <int DT>
OCTAVO_A8_TARGET static void a8_quantize_row(const IntLinearArgs& a, float input_scale, int64_t row,
                                             int8_t* xq, float* xs, int32_t* xsum) {
  using E = Act<DT>;
  const int64_t K = a.w.k, kv = K & ~(int64_t)15;
  const typename E::T* x = (const typename E::T*)a.x + row * a.x_stride;
  float scale = input_scale;
  if (scale <= 0.f) {
    __m512 mx = _mm512_setzero_ps();
    for (int64_t k = 0; k < kv; k += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(E::load16(x + k).v));
    float amax = _mm512_reduce_max_ps(mx);
    for (int64_t k = kv; k < K; ++k) amax = fmaxf(amax, fabsf(E::to_f(x[k])));
    scale = amax / 127.5f;
    if (!(scale >= 1e-12f)) scale = 1e-12f;
  }
  const __m512 sv = _mm512_set1_ps(scale);
  for (int64_t k = 0; k < kv; k += 16) {
    __m512 r = _mm512_roundscale_ps(_mm512_div_ps(E::load16(x + k).v, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-128.f)), _mm512_set1_ps(127.f));
    _mm_storeu_si128((__m128i*)(xq + k), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  for (int64_t k = kv; k < K; ++k) {
    const float r = nearbyintf(E::to_f(x[k]) / scale);
    xq[k] = (int8_t)(r < -128.f ? -128 : r > 127.f ? 127 : (int)r);
  }
  *xs = scale;
  const int G = n_groups(a.w);
  for (int g = 0; g < G; ++g) {
    int32_t t = 0;
    for (int64_t k = (int64_t)g * a.w.group; k < (int64_t)(g + 1) * a.w.group; ++k) t += xq[k];
    xsum[g] = t;
  }
}

#if OCTAVO_QUANT_AMX
// bf16 batches of more than kA8AmxMinRows rows where the AMX path applies: the int8 codes as bf16
// (exact) through amx_linear, the per-row activation scale applied in its fp32 epilogue. Same
// integers; the group sums accumulate in fp32 (TDPBF16PS) instead of int32.
constexpr int64_t kA8AmxMinRows = 8;
static thread_local TlsBuffer a8_codes;

static const char* a8_amx(const IntLinearArgs& a, const int8_t* xq, const float* xs) {
  const int64_t K = a.w.k;
  uint16_t* xb = (uint16_t*)a8_codes.get((size_t)(a.m * K * 2));
  if (!xb) return "out of memory for the activation codes";
  for (int64_t i = 0; i < a.m * K; ++i) xb[i] = f32_to_bf16_bits((float)xq[i]);
  IntLinearArgs b = a;
  b.x = xb;
  b.x_stride = K;
  return amx_linear(b, xs);
}
#endif

template <int DT>
static const char* a8_linear_dt(const IntLinearArgs& a) {
  const float input_scale = a.input_scale;
  if (const char* e = a8_unsupported(a)) return e;
  const int64_t K = a.w.k;
  const int G = n_groups(a.w);
  const size_t xq_bytes = (size_t)(a.m * K + 63) & ~(size_t)63;
  uint8_t* buf = (uint8_t*)malloc(xq_bytes + sizeof(float) * (size_t)a.m + sizeof(int32_t) * (size_t)(a.m * G));
  if (!buf) return "out of memory for the activation buffer";
  int8_t* xq = (int8_t*)buf;
  float* xs = (float*)(buf + xq_bytes);
  int32_t* xsum = (int32_t*)(xs + a.m);
  for (int64_t i = 0; i < a.m; ++i) a8_quantize_row<DT>(a, input_scale, i, xq + i * K, xs + i, xsum + i * G);
#if OCTAVO_QUANT_AMX
  if (DT == kBFloat16 && a.m > kA8AmxMinRows && amx_applies(a)) {
    const char* e = a8_amx(a, xq, xs);
    free(buf);
    return e;
  }
#endif
  const int threads = threading::resolve_threads(a.num_threads);
  const int64_t nt = n_tiles(a.w), per = tiles_per_item(nt, a.m, threads);
  A8Ctx c{&a, xq, xs, xsum, per, {}};
  a8_index(a.w.bits, c.idx);
  const int64_t items = (nt + per - 1) / per;
  threading::parallel_run(items, items > 1 ? threads : 1, a.w.bits == 8 ? &a8_item<DT, 8> : &a8_item<DT, 4>, &c);
  free(buf);
  return nullptr;
}

#endif  // OCTAVO_QUANT_A8
