// The one source of octavo's CPU kernels. kernels.cpp includes it once per ISA, after that
// ISA's vector header (vec_<isa>.h), inside namespace octavo::OCTAVO_ISA_NS. Everything here is
// written against the logical 16-float vector F and its helpers; the micro-kernel shapes come
// from the header's constants (kQkRows, kPvRows, kPvCols).
//
// Paged attention, per work item (sequence, KV head, query tile):
//   rows = the tile's query tokens x the query heads that share the KV head (GQA: every K/V
//   load is reused by all of them). For each KV block of the sequence, in order:
//     S = Q K^T          broadcast-FMA micro-GEMM over the transposed K tile (or VDPBF16PS)
//     causal mask        keys after a row's position get -inf
//     online softmax     running max m, running sum l, accumulator rescaled by exp(m_old - m_new)
//     acc += P V         broadcast-FMA micro-GEMM over the V tile
//   out = acc / l. All accumulation in fp32.
// On CPUs with AMX (bf16, AVX512-BF16 variant) both products run as TDPBF16PS on tiles
// instead: the cache layout is already AMX's (the K tile is a B operand of 16 dim pairs x 16
// keys, the V tile one of 8 key pairs x 16 dims), P is the same bf16 as VDPBF16PS's.
// Do not use std:: templates in this file: one test binary links several ISA variants, and a
// shared inline instantiation compiled with AVX-512 flags could be picked for the AVX2 path.
#pragma once

#include <atomic>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "scalar_convert.h"

// bf16 attention on AMX tiles: the AVX512-BF16 variant on x86-64 Linux (used only where CPUID
// reports AMX-TILE and AMX-BF16 and the kernel grants the tile state).
#if defined(OCTAVO_ISA_AVX512) && defined(__AVX512BF16__) && defined(__x86_64__) && defined(__linux__)
#define OCTAVO_ATTN_AMX 1
#include <immintrin.h>
#include "amx.h"
#define OCTAVO_ATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#else
#define OCTAVO_ATTN_AMX 0
#endif

namespace octavo {
namespace OCTAVO_ISA_NS {

// ------------------------------------------------------------------------------------------
// element types

template <int DT> struct Elem;
template <> struct Elem<kFloat32> {
  using T = float;
  static constexpr int P = 1;
  static inline F load16(const T* p) { return load(p); }
  static inline void store16(T* p, F x) { store(p, x); }
  static inline float to_f(T x) { return x; }
  static inline T from_f(float x) { return x; }
};
template <> struct Elem<kBFloat16> {
  using T = uint16_t;
  static constexpr int P = 2;
  static inline F load16(const T* p) { return load_bf16(p); }
  static inline void store16(T* p, F x) { store_bf16(p, x); }
  static inline float to_f(T x) { return bf16_bits_to_f32(x); }
  static inline T from_f(float x) { return f32_to_bf16_bits(x); }
  static inline void split(R r, F& lo, F& hi) { split_bf16(r, lo, hi); }
};
template <> struct Elem<kFloat16> {
  using T = uint16_t;
  static constexpr int P = 2;
  static inline F load16(const T* p) { return load_f16(p); }
  static inline void store16(T* p, F x) { store_f16(p, x); }
  static inline float to_f(T x) { return f16_bits_to_f32(x); }
  static inline T from_f(float x) { return f32_to_f16_bits(x); }
  static inline void split(R r, F& lo, F& hi) { split_f16(r, lo, hi); }
};

// Round a vector to the element type and back (where eager torch rounds between ops).
template <int DT> static inline F round_to(F x) {
  if constexpr (DT == kFloat32) return x;
  else if constexpr (DT == kBFloat16) return round_bf16(x);
  else return round_f16(x);
}
template <int DT> static inline float round_to1(float x) {
  return Elem<DT>::to_f(Elem<DT>::from_f(x));
}

// exp(x) for a vector: 2^(x log2 e) = 2^n * 2^f, n = round(.), |f| <= 1/2, 2^f by its Taylor
// series to degree 7 (relative error < 1e-8 before fp32 rounding). Inputs below ~-88 give 0.
static inline F vexp(F x) {
  F y = mul(x, bcast(1.44269504088896341f));
  y = min(max(y, bcast(-127.f)), bcast(127.f));
  F n = round_nearest(y);
  F f = sub(y, n);
  F p = bcast(1.5252733804059840e-5f);
  p = fma(p, f, bcast(1.5403530393381610e-4f));
  p = fma(p, f, bcast(1.3333558146428443e-3f));
  p = fma(p, f, bcast(9.6181291076284772e-3f));
  p = fma(p, f, bcast(5.5504108664821580e-2f));
  p = fma(p, f, bcast(2.4022650695910071e-1f));
  p = fma(p, f, bcast(6.9314718055994531e-1f));
  p = fma(p, f, bcast(1.f));
  return mul(p, pow2i(n));
}

// ------------------------------------------------------------------------------------------
// per-thread scratch (grown on demand, freed when the thread exits)

#include "tls_buffer.h"  // struct TlsBuffer, in this ISA namespace
static thread_local TlsBuffer tls_scratch;

static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

// ------------------------------------------------------------------------------------------
// write K/V at the slot mapping

template <int DT>
struct WriteKV {
  using E = Elem<DT>;
  using T = typename E::T;
  static constexpr int P = E::P;
  static constexpr int kTokensPerItem = 16;

  // Token i's K and V of KV heads [h0, h0 + nh) into the cache at its slot (negative: skipped).
  static inline void token(const WriteKVArgs& a, int64_t i, int h0, int nh) {
    const int64_t slot = a.slot_mapping[i];
    if (slot < 0) return;
    const int D = a.head_size, bs = a.block_size;
    const size_t tile = (size_t)bs * D;
    T* cache = (T*)a.kv_cache;
    const int64_t blk = slot / bs;
    const int off = (int)(slot % bs);
    for (int h = h0; h < h0 + nh; ++h) {
      const T* k = (const T*)a.key + i * a.k_stride_tok + h * a.k_stride_head;
      const T* v = (const T*)a.value + i * a.v_stride_tok + h * a.v_stride_head;
      T* kt = cache + (blk * a.num_kv_heads + h) * 2 * tile;
      T* vt = kt + tile;
      T* kp = kt + off * P;
      for (int d = 0; d < D; d += P)
        for (int e = 0; e < P; ++e) kp[(size_t)(d / P) * bs * P + e] = k[d + e];
      T* vp = vt + (size_t)(off / P) * D * P + off % P;
      for (int d = 0; d < D; ++d) vp[(size_t)d * P] = v[d];
    }
  }

  // Prefetch, for writing, the cache lines token(a, i, h0, nh) will store to.
  static inline void prefetch_token(const WriteKVArgs& a, int64_t i, int h0, int nh) {
    const int64_t slot = a.slot_mapping[i];
    if (slot < 0) return;
    const int D = a.head_size, bs = a.block_size;
    const size_t tile = (size_t)bs * D;
    const T* cache = (const T*)a.kv_cache;
    const int64_t blk = slot / bs;
    const int off = (int)(slot % bs);
    for (int h = h0; h < h0 + nh; ++h) {
      const T* kp = cache + (blk * a.num_kv_heads + h) * 2 * tile + off * P;
      for (int d = 0; d < D; d += P) __builtin_prefetch(kp + (size_t)(d / P) * bs * P, 1, 3);
      const char* vp = (const char*)(kp - off * P + tile + (size_t)(off / P) * D * P);
      for (size_t o = 0; o < (size_t)D * P * sizeof(T); o += 64) __builtin_prefetch(vp + o, 1, 3);
    }
  }

  static void item_fn(void* ctx, int64_t item, int /*tid*/) {
    const WriteKVArgs& a = *(const WriteKVArgs*)ctx;
    const int64_t i0 = item * kTokensPerItem;
    const int64_t i1 = i0 + kTokensPerItem < a.num_tokens ? i0 + kTokensPerItem : a.num_tokens;
    for (int64_t i = i0; i < i1; ++i) token(a, i, 0, a.num_kv_heads);
  }

  static void run(const WriteKVArgs& a) {
    const int64_t n_items = (a.num_tokens + kTokensPerItem - 1) / kTokensPerItem;
    const int threads = n_items >= 8 ? a.num_threads : 1;
    threading::parallel_run(n_items, threads, &item_fn, (void*)&a);
  }
};

// ------------------------------------------------------------------------------------------
// paged attention

#if OCTAVO_ATTN_AMX
static bool attention_amx_ready() { return kHasBf16Dot && amx::tiles_ready(); }
#else
static bool attention_amx_ready() { return false; }
#endif

template <int DT>
struct PagedAttention {
  using E = Elem<DT>;
  using T = typename E::T;
  static constexpr int P = E::P;
  // VDPBF16PS for both products (Q and P rounded to bf16 pairs, products exact, fp32 sums).
  static constexpr bool kDot = (DT == kBFloat16) && kHasBf16Dot;
  static constexpr int kTileRows = 64;  // target rows (query tokens x group) per work item
  static constexpr int kMaxChunk = 256;  // largest block size (keys per softmax chunk)

  const PagedAttentionArgs& a;
  int G, D, bs, QT, ct;  // ct: tokens per softmax chunk (whole blocks, >= 64)
  bool amx;              // Q.K^T and P.V on AMX tiles (where amx_rows() allows)
  size_t off_qf, off_s, off_pb, off_acc, off_m, off_l, off_qrow, off_vz, scratch_bytes;

  explicit PagedAttention(const PagedAttentionArgs& args) : a(args) {
    G = a.num_heads / a.num_kv_heads;
    D = a.head_size;
    bs = a.block_size;
    QT = G >= kTileRows ? 1 : kTileRows / G;
    ct = bs >= 64 ? bs : (64 / bs) * bs;
    amx = attention_amx_ready() && DT == kBFloat16 && a.allow_amx && D % 32 == 0;
    // rows of a work item: a query tile of one KV head's group, or (decode) every head; + 16
    // rows of slack that an AMX item's last row tile may run into (amx_rows)
    const size_t rows = (size_t)(QT * G > a.num_heads ? QT * G : a.num_heads) + 16;
    size_t o = 0;
    off_qf = o;   o += align64(rows * D * sizeof(float));
    off_s = o;    o += align64(rows * ct * sizeof(float));
    off_pb = o;   o += align64(rows * ct * sizeof(uint16_t));
    off_acc = o;  o += align64(rows * D * sizeof(float));
    off_m = o;    o += align64(rows * sizeof(float));
    off_l = o;    o += align64(rows * sizeof(float));
    off_qrow = o; o += align64(rows * sizeof(void*));
    off_vz = o;   o += align64((size_t)16 * D * sizeof(T));  // 16 keys of V (amx_v_tail)
    scratch_bytes = o;
  }

  // ---- S[rows, NG groups of 16 keys] = Q K^T over transposed K tiles ----
  // kp[g] points at key group g (16 consecutive keys of one block, possibly different blocks).
  // One pass over the head dims covers NG groups: each K vector load feeds RB rows, each
  // broadcast query value NG groups. With few accumulators (decode: RB = the GQA group) the
  // dims are split over two accumulator sets so the dependency chains are half as long.
  template <int RB, int NG>
  static inline void qk_group(const T* const* kp, int bs, int D, const float* qf,
                              const T* const* qrow, float* s, int s_stride) {
    constexpr int NS = RB * NG <= 8 ? 2 : 1;  // accumulator sets
    F acc[NS][RB][NG];
    for (int k = 0; k < NS; ++k)
      for (int r = 0; r < RB; ++r)
        for (int g = 0; g < NG; ++g) acc[k][r][g] = zero();
    if constexpr (P == 1) {
      for (int d = 0; d < D; d += NS) {
        for (int k = 0; k < NS; ++k) {
          F b[NG];
          for (int g = 0; g < NG; ++g) b[g] = E::load16(kp[g] + (size_t)(d + k) * bs);
          for (int r = 0; r < RB; ++r) {
            const F q = bcast(qf[r * D + d + k]);
            for (int g = 0; g < NG; ++g) acc[k][r][g] = fma(b[g], q, acc[k][r][g]);
          }
        }
      }
    } else {
      const int D2 = D / 2;
      for (int d2 = 0; d2 < D2; d2 += NS) {
        for (int k = 0; k < NS; ++k) {
          R b[NG];
          for (int g = 0; g < NG; ++g) b[g] = load_raw(kp[g] + (size_t)(d2 + k) * bs * 2);
          if constexpr (kDot) {
            for (int r = 0; r < RB; ++r) {
              uint32_t qp;
              memcpy(&qp, qrow[r] + 2 * (d2 + k), 4);
              for (int g = 0; g < NG; ++g) acc[k][r][g] = dot_bf16_pair(acc[k][r][g], b[g], qp);
            }
          } else {
            F lo[NG], hi[NG];
            for (int g = 0; g < NG; ++g) E::split(b[g], lo[g], hi[g]);
            for (int r = 0; r < RB; ++r) {
              const F q0 = bcast(qf[r * D + 2 * (d2 + k)]), q1 = bcast(qf[r * D + 2 * (d2 + k) + 1]);
              for (int g = 0; g < NG; ++g) acc[k][r][g] = fma(hi[g], q1, fma(lo[g], q0, acc[k][r][g]));
            }
          }
        }
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int g = 0; g < NG; ++g) {
        F v = acc[0][r][g];
        if constexpr (NS == 2) v = add(v, acc[NS - 1][r][g]);
        store(s + r * s_stride + 16 * g, v);
      }
  }

  // ---- the same for a row-major K tile (layout benchmark only): one dot product per key ----
  // S for `rows` rows over the chunk's ng key groups (kp: group pointers).
  template <int RB>
  inline void qk_rows(const T* const* kp, int ng, const float* qf, const T* const* qrow, float* s) const {
    // as many key groups per pass as the accumulator budget allows (1, 2 or 4)
    constexpr int kMaxNG = kQkAcc / RB >= 4 ? 4 : kQkAcc / RB >= 2 ? 2 : 1;
    int g = 0;
    for (; g + kMaxNG <= ng; g += kMaxNG) qk_group<RB, kMaxNG>(kp + g, bs, D, qf, qrow, s + 16 * g, ct);
    if constexpr (kMaxNG > 2)
      for (; g + 2 <= ng; g += 2) qk_group<RB, 2>(kp + g, bs, D, qf, qrow, s + 16 * g, ct);
    for (; g < ng; ++g) qk_group<RB, 1>(kp + g, bs, D, qf, qrow, s + 16 * g, ct);
  }

  void qk(const T* const* kp, int rows, int ng, const float* qf, const T* const* qrow, float* s) const {
    int r0 = 0;
    for (; r0 + kQkRows <= rows; r0 += kQkRows)
      qk_rows<kQkRows>(kp, ng, qf + (size_t)r0 * D, qrow + r0, s + (size_t)r0 * ct);
    const int rem = rows - r0;
    const float* q = qf + (size_t)r0 * D;
    float* sp = s + (size_t)r0 * ct;
    switch (rem) {
      case 0: break;
      case 1: qk_rows<1>(kp, ng, q, qrow + r0, sp); break;
      case 2: qk_rows<2>(kp, ng, q, qrow + r0, sp); break;
      case 3: qk_rows<3>(kp, ng, q, qrow + r0, sp); break;
      case 4: qk_rows<4>(kp, ng, q, qrow + r0, sp); break;
      case 5: qk_rows<5>(kp, ng, q, qrow + r0, sp); break;
      case 6: qk_rows<6>(kp, ng, q, qrow + r0, sp); break;
      default: qk_rows<7>(kp, ng, q, qrow + r0, sp); break;
    }
  }

  // ---- acc[rows, 16*CB columns at c0] += P[rows, keys] V[keys, columns] over the chunk ----
  // vt[i] is the V tile of the chunk's block i; the last block holds nt_last keys. The
  // accumulators stay in registers across all blocks of the chunk.
  template <int RB, int CB>
  inline void pv_tile(const T* const* vt, int nblk, int nt_last, int c0, const float* p,
                      const uint16_t* pb, float* acc) const {
    F o[RB][CB];
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < CB; ++c) o[r][c] = load(acc + (size_t)r * D + c0 + 16 * c);
    for (int bi = 0; bi < nblk; ++bi) {
      const int nt = bi == nblk - 1 ? nt_last : bs;
      const int po = bi * bs;  // column of the block's first key in P
      if constexpr (P == 1) {
        for (int t = 0; t < nt; ++t) {
          F b[CB];
          for (int c = 0; c < CB; ++c) b[c] = E::load16(vt[bi] + (size_t)t * D + c0 + 16 * c);
          for (int r = 0; r < RB; ++r) {
            F pr = bcast(p[r * ct + po + t]);
            for (int c = 0; c < CB; ++c) o[r][c] = fma(b[c], pr, o[r][c]);
          }
        }
      } else {
        int t = 0;
        for (; t + 1 < nt; t += 2) {
          const T* vp = vt[bi] + (size_t)(t / 2) * D * 2 + c0 * 2;
          if constexpr (kDot) {
            R b[CB];
            for (int c = 0; c < CB; ++c) b[c] = load_raw(vp + 32 * c);
            for (int r = 0; r < RB; ++r) {
              uint32_t pp;
              memcpy(&pp, pb + r * ct + po + t, 4);
              for (int c = 0; c < CB; ++c) o[r][c] = dot_bf16_pair(o[r][c], b[c], pp);
            }
          } else {
            F lo[CB], hi[CB];
            for (int c = 0; c < CB; ++c) E::split(load_raw(vp + 32 * c), lo[c], hi[c]);
            for (int r = 0; r < RB; ++r) {
              F p0 = bcast(p[r * ct + po + t]), p1 = bcast(p[r * ct + po + t + 1]);
              for (int c = 0; c < CB; ++c) o[r][c] = fma(hi[c], p1, fma(lo[c], p0, o[r][c]));
            }
          }
        }
        if (t < nt) {  // odd tail: the pair's second key may be past the end of the sequence
          const T* vp = vt[bi] + (size_t)(t / 2) * D * 2 + c0 * 2;
          F lo[CB], hi[CB];
          for (int c = 0; c < CB; ++c) E::split(load_raw(vp + 32 * c), lo[c], hi[c]);
          for (int r = 0; r < RB; ++r) {
            F p0 = bcast(kDot ? bf16_bits_to_f32(pb[r * ct + po + t]) : p[r * ct + po + t]);
            for (int c = 0; c < CB; ++c) o[r][c] = fma(lo[c], p0, o[r][c]);
          }
        }
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < CB; ++c) store(acc + (size_t)r * D + c0 + 16 * c, o[r][c]);
  }

  template <int RB>
  inline void pv_rows(const T* const* vt, int nblk, int nt_last, const float* p, const uint16_t* pb,
                      float* acc) const {
    const int ncol = D / 16;
    int c = 0;
    for (; c + kPvCols <= ncol; c += kPvCols) pv_tile<RB, kPvCols>(vt, nblk, nt_last, 16 * c, p, pb, acc);
    for (; c < ncol; ++c) pv_tile<RB, 1>(vt, nblk, nt_last, 16 * c, p, pb, acc);
  }

  void pv(const T* const* vt, int nblk, int nt_last, int rows, const float* p, const uint16_t* pb,
          float* acc) const {
    int r0 = 0;
    for (; r0 + kPvRows <= rows; r0 += kPvRows)
      pv_rows<kPvRows>(vt, nblk, nt_last, p + (size_t)r0 * ct, pb + (size_t)r0 * ct, acc + (size_t)r0 * D);
    const int rem = rows - r0;
    const float* pp = p + (size_t)r0 * ct;
    const uint16_t* pbp = pb + (size_t)r0 * ct;
    float* ap = acc + (size_t)r0 * D;
    switch (rem) {
      case 0: break;
      case 1: pv_rows<1>(vt, nblk, nt_last, pp, pbp, ap); break;
      case 2: pv_rows<2>(vt, nblk, nt_last, pp, pbp, ap); break;
      default: pv_rows<3>(vt, nblk, nt_last, pp, pbp, ap); break;
    }
  }

  // Prefetch every line of the K/V tiles of heads [h0, h0 + nh) of a block (one contiguous
  // stretch). The block table is random and each tile is only 32-64 lines, too short for the
  // stream prefetcher to ramp up: in the engine the KV cache comes from DRAM (the other layers
  // and the weights evicted it since the last step), and prefetching only each tile's first lines
  // left the loads waiting (48 x 250 tokens, SmolLM2 heads, cold: 715 -> 560 us per layer). With
  // the KV in the last-level cache the extra instructions cost ~15% instead.
  // A prefill tile (whole: false) is compute-bound and re-reads K/V that earlier tiles brought
  // in: there only each tile's first two lines, for the stream prefetcher to follow.
  inline void prefetch_block(const T* cache, int32_t blk, int h0, int nh, size_t tile, bool whole) const {
    const char* p = (const char*)(cache + ((int64_t)blk * a.num_kv_heads + h0) * 2 * tile);
    const size_t bytes = (size_t)nh * 2 * tile * sizeof(T), tb = tile * sizeof(T);
    if (whole) {
      for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
    } else {
      for (size_t o = 0; o < bytes; o += tb) {
        __builtin_prefetch(p + o, 0, 3);
        __builtin_prefetch(p + o + 64, 0, 3);
      }
    }
  }

#if OCTAVO_ATTN_AMX
  // ---- the AMX path (bf16): one tile configuration per work item ----
  // Tiles: 0-1 C (R rows x 16 fp32: S of two 16-key groups, or acc of two 16-dim columns),
  // 2 A = Q (R rows x 32 dims), 3 A = P (R rows x 16 keys), 4-5 B = K^T (16 dim pairs x 16
  // keys), 6-7 B = V (8 key pairs x 16 dims); R = amx_rows().
  OCTAVO_ATTN_AMX_TARGET static void amx_begin(int R) {
    const uint8_t rows[8] = {(uint8_t)R, (uint8_t)R, (uint8_t)R, (uint8_t)R, 16, 16, 8, 8};
    const uint16_t colsb[8] = {64, 64, 64, 32, 64, 64, 64, 64};
    amx::configure(rows, colsb);
  }
  OCTAVO_ATTN_AMX_TARGET static void amx_end() { _tile_release(); }

  // S[hrows, ngc groups of 16 keys] = Q K^T; q: the head's query rows as bf16 [.][D].
  OCTAVO_ATTN_AMX_TARGET void qk_amx(const T* const* kp, int hrows, int R, int ngc, const T* q,
                                     float* s) const {
    const int64_t kstride = (int64_t)bs * P * sizeof(T);  // bytes between dim pairs of a K tile
    const int64_t sstride = (int64_t)ct * sizeof(float);
    for (int r0 = 0; r0 < hrows; r0 += R) {
      const T* qr = q + (size_t)r0 * D;
      float* sr = s + (size_t)r0 * ct;
      for (int g = 0; g < ngc; g += 2) {
        const bool two = g + 1 < ngc;
        _tile_zero(0);
        _tile_zero(1);
        for (int d = 0; d < D; d += 32) {
          const size_t koff = (size_t)(d / 2) * bs * P;
          _tile_loadd(2, qr + d, D * sizeof(T));
          _tile_loadd(4, kp[g] + koff, kstride);
          _tile_dpbf16ps(0, 2, 4);
          if (two) {
            _tile_loadd(5, kp[g + 1] + koff, kstride);
            _tile_dpbf16ps(1, 2, 5);
          }
        }
        _tile_stored(0, sr + 16 * g, sstride);
        if (two) _tile_stored(1, sr + 16 * (g + 1), sstride);
      }
    }
  }

  // acc[hrows, D] += P V over the chunk's blocks (vt as for pv; vz: amx_v_tail of the last
  // block's partial 16-key group, if it has one).
  OCTAVO_ATTN_AMX_TARGET void pv_amx(const T* const* vt, int nblk, int nt_last, int hrows, int R,
                                     const uint16_t* pb, float* acc, const T* vz) const {
    const int64_t vstride = (int64_t)D * P * sizeof(T);  // bytes between key pairs of a V tile
    const int64_t astride = (int64_t)D * sizeof(float), pstride = (int64_t)ct * sizeof(uint16_t);
    for (int r0 = 0; r0 < hrows; r0 += R) {
      for (int c = 0; c < D; c += 32) {
        float* ac = acc + (size_t)r0 * D + c;
        _tile_loadd(0, ac, astride);
        _tile_loadd(1, ac + 16, astride);
        for (int bi = 0; bi < nblk; ++bi) {
          const int nt = bi == nblk - 1 ? nt_last : bs;
          for (int t = 0; t < nt; t += 16) {
            const T* v = t + 16 > nt ? vz : vt[bi] + (size_t)(t / 2) * D * P;
            _tile_loadd(3, pb + (size_t)r0 * ct + bi * bs + t, pstride);
            _tile_loadd(6, v + c * P, vstride);
            _tile_loadd(7, v + (c + 16) * P, vstride);
            _tile_dpbf16ps(0, 3, 6);
            _tile_dpbf16ps(1, 3, 7);
          }
        }
        _tile_stored(0, ac, astride);
        _tile_stored(1, ac + 16, astride);
      }
    }
  }
#else
  static void amx_begin(int) {}
  static void amx_end() {}
  void qk_amx(const T* const*, int, int, int, const T*, float*) const {}
  void pv_amx(const T* const*, int, int, int, int, const uint16_t*, float*, const T*) const {}
#endif

  // P rounded to bf16 for P.V: stored, and returned as the floats it now holds. With AVX512-BF16
  // one VCVTNEPS2BF16 (round to nearest even; P is in [0, 1], and its denormals, which
  // that instruction flushes to zero, are below anything the fp32 sums keep).
  static inline F store_p_bf16(uint16_t* p, F e) {
#if defined(OCTAVO_ISA_AVX512) && defined(__AVX512BF16__)
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(e.v);
    _mm256_storeu_si256((__m256i*)p, h);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
#else
    store_bf16(p, e);
    return load_bf16(p);
#endif
  }

  // Rows per AMX row tile for an item of nh heads x hrows rows, or 0: the vector path. A head's
  // last row tile may run past its rows: harmless with one head (the scratch has 16 rows of
  // slack), but it would overwrite the next head's rows, so several heads need whole tiles.
  int amx_rows(int nh, int hrows) const {
    if (!amx) return 0;
    const int R = hrows < 16 ? hrows : 16;
    return nh == 1 || hrows % R == 0 ? R : 0;
  }

  // The V tile rows of keys [t0, t0 + 16) with zeros from key nt on (slots past the sequence
  // may hold anything, and a zero P times a NaN there would still poison the tile product).
  // A tile row holds one key pair ([D][P] values) and t0 is even: whole pairs are one memcpy,
  // an odd last key keeps its pair row's low halves.
  void amx_v_tail(const T* v, int t0, int nt, T* vz) const {
    const size_t row = (size_t)D * P;  // values per key pair
    const int whole = (nt - t0) / P;
    size_t done = whole * row;
    memcpy(vz, v + (size_t)(t0 / P) * row, done * sizeof(T));
    if ((nt - t0) % P) {
      const T* src = v + (size_t)(t0 / P + whole) * row;
      T* dst = vz + done;
      memset(dst, 0, row * sizeof(T));
      for (int d = 0; d < D; ++d) dst[(size_t)d * P] = src[(size_t)d * P];
      done += row;
    }
    memset(vz + done, 0, ((size_t)16 * D - done) * sizeof(T));
  }

  // ---- one work item: query tile qt of request req, KV heads [h0, h0 + nh) ----
  // Rows are ordered (head, query token, group member): r = (hh * nq + jj) * G + g.
  void run(int req, int h0, int nh, int qt, char* scratch) const {
    const int64_t qs = a.query_start_loc[req];
    const int qlen = a.query_start_loc[req + 1] - (int)qs;
    // a decode's own K/V (a.write): its lines are requested now, written before the last chunk
    bool write_pending = a.write && qlen == 1 && qs < a.write->num_tokens;
    if (write_pending) WriteKV<DT>::prefetch_token(*a.write, qs, h0, nh);
    const int seq_len = a.seq_lens[req];
    const int ctx = seq_len - qlen;
    const int j0 = qt * QT;
    const int nq = qlen - j0 < QT ? qlen - j0 : QT;
    const int hrows = nq * G;  // rows per KV head
    const int rows = nh * hrows;
    float* qf = (float*)(scratch + off_qf);
    float* s = (float*)(scratch + off_s);
    uint16_t* pb = (uint16_t*)(scratch + off_pb);
    float* acc = (float*)(scratch + off_acc);
    float* m = (float*)(scratch + off_m);
    float* l = (float*)(scratch + off_l);
    const T** qrow = (const T**)(scratch + off_qrow);
    const T* query = (const T*)a.query;
    const T* kgrp[kMaxChunk / 16];  // per key group of the chunk: K data, tile, first key
    const T* vtl[kMaxChunk / 16];  // per block of the chunk: V tile

    for (int hh = 0; hh < nh; ++hh)
      for (int jj = 0; jj < nq; ++jj)
        for (int g = 0; g < G; ++g)
          qrow[(hh * nq + jj) * G + g] =
              query + (qs + j0 + jj) * a.q_stride + (int64_t)((h0 + hh) * G + g) * D;
    const int R = amx_rows(nh, hrows);  // > 0: the AMX path, rows per tile
    T* qb = (T*)qf;                      // AMX: the rows' queries, contiguous [rows][D]
    T* vz = (T*)(scratch + off_vz);
    if (R) {
      amx_begin(R);
      for (int r = 0; r < rows; ++r) memcpy(qb + (size_t)r * D, qrow[r], (size_t)D * sizeof(T));
    }
    if (!kDot) {
      for (int r = 0; r < rows; ++r)
        for (int d = 0; d < D; d += 16) store(qf + (size_t)r * D + d, E::load16(qrow[r] + d));
    }
    for (int r = 0; r < rows; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.f;
    }
    memset(acc, 0, (size_t)rows * D * sizeof(float));

    const int kv_end = ctx + j0 + nq;  // keys [0, kv_end) are visible to some row of the tile
    const int nblocks = (kv_end + bs - 1) / bs;
    // Sliding window: keys before kv_lo are outside every row's window; start at its block.
    const int win = a.sliding_window;
    const int kv_lo = win > 0 && ctx + j0 - win + 1 > 0 ? ctx + j0 - win + 1 : 0;
    const int bstart = kv_lo / bs;
    const int32_t* bt = a.block_table + (int64_t)req * a.bt_stride;
    const T* cache = (const T*)a.kv_cache;
    const size_t tile = (size_t)bs * D;
    const float scale = a.scale;
    const float cap = a.soft_cap;

    const int bpc = ct / bs;  // blocks per chunk
    // The block table is random, so the hardware cannot guess the next block: prefetch the
    // item's K/V tiles of the block ~32 KiB ahead (one block for large blocks, more for small).
    const size_t block_bytes = (size_t)nh * 2 * tile * sizeof(T);
    int pf_dist = block_bytes >= 32768 ? 1 : (int)(32768 / block_bytes);
    if (pf_dist < bpc) pf_dist = bpc;  // at least the next chunk
    for (int pbk = bstart; pbk < bstart + pf_dist && pbk < nblocks; ++pbk) prefetch_block(cache, bt[pbk], h0, nh, tile, nq == 1);
    for (int b0 = bstart; b0 < nblocks; b0 += bpc) {
      const int c0 = b0 * bs;                                     // first key of the chunk
      const int nc = kv_end - c0 < ct ? kv_end - c0 : ct;          // keys of the chunk
      const int b1 = b0 + bpc < nblocks ? b0 + bpc : nblocks;

      const int ngc = (nc + 15) / 16;  // 16-key groups in the chunk (blocks are multiples of 16)
      if (write_pending && b1 == nblocks) {  // the token's slot is in the last block
        WriteKV<DT>::token(*a.write, qs, h0, nh);
        write_pending = false;
      }
      for (int b = b0; b < b1; ++b)
        if (b + pf_dist < nblocks) prefetch_block(cache, bt[b + pf_dist], h0, nh, tile, nq == 1);

      // S = Q K^T over the whole chunk, head by head
      for (int hh = 0; hh < nh; ++hh) {
        for (int g = 0; g < ngc; ++g) {
          const int b = b0 + (16 * g) / bs, tok = (16 * g) % bs;
          const T* kt = cache + ((int64_t)bt[b] * a.num_kv_heads + h0 + hh) * 2 * tile;
          kgrp[g] = kt + tok * P;
        }
        if (R)
          qk_amx(kgrp, hrows, R, ngc, qb + (size_t)hh * hrows * D, s + (size_t)hh * hrows * ct);
        else
          qk(kgrp, hrows, ngc, qf + (size_t)hh * hrows * D, qrow + hh * hrows, s + (size_t)hh * hrows * ct);
      }

      // causal mask + online softmax, row by row
      for (int r = 0; r < rows; ++r) {
        float* sr = s + (size_t)r * ct;
        uint16_t* pr = pb + (size_t)r * ct;
        const int qpos = ctx + j0 + (r / G) % nq;
        int valid = qpos - c0 + 1;  // keys of this chunk the row may see
        if (valid > nc) valid = nc;
        // first key of the chunk inside the row's window (0 without a window)
        const int first = win > 0 && qpos - win + 1 - c0 > 0 ? qpos - win + 1 - c0 : 0;
        if (valid <= first) {
          if (kDot) memset(pr, 0, (size_t)ngc * 16 * sizeof(uint16_t));
          else memset(sr, 0, (size_t)ngc * 16 * sizeof(float));
          continue;
        }
        if (cap > 0.f) {  // soft cap on the scaled score; sr stays unscaled (scale applied below)
          const float in = scale / cap, outs = cap / scale;
          for (int t = first; t < valid; ++t) sr[t] = outs * tanhf(sr[t] * in);
        }
        // masked keys -> -inf: whole 16-key groups with vector stores (a vector load right after
        // scalar stores to its line waits for them: that stall was ~10% of a prefill item)
        const int vend = (valid + 15) & ~15, fbeg = first & ~15;
        for (int t = valid; t < vend; ++t) sr[t] = -INFINITY;
        for (int t = vend; t < ngc * 16; t += 16) store(sr + t, bcast(-INFINITY));
        for (int t = 0; t < fbeg; t += 16) store(sr + t, bcast(-INFINITY));
        for (int t = fbeg; t < first; ++t) sr[t] = -INFINITY;
        F mx = load(sr);
        for (int g = 1; g < ngc; ++g) mx = max(mx, load(sr + 16 * g));
        const float m_blk = hmax(mx) * scale;
        const float m_old = m[r];
        const float m_new = m_blk > m_old ? m_blk : m_old;
        if (m_new != m_old) {
          const float corr = expf(m_old - m_new);
          l[r] *= corr;
          if (b0 > bstart) {
            F cv = bcast(corr);
            float* ar = acc + (size_t)r * D;
            for (int d = 0; d < D; d += 16) store(ar + d, mul(load(ar + d), cv));
          }
          m[r] = m_new;
        }
        const F sc = bcast(scale), nm = bcast(-m_new);
        F sum = zero();
        for (int g = 0; g < ngc; ++g) {
          F e = vexp(fma(load(sr + 16 * g), sc, nm));
          if (kDot) {
            e = store_p_bf16(pr + 16 * g, e);  // sum what P.V will use
          } else {
            store(sr + 16 * g, e);
          }
          sum = add(sum, e);
        }
        l[r] += hsum(sum);
      }

      // acc += P V over the chunk, head by head
      const int nblk = b1 - b0;
      const int nt_last = nc - (nblk - 1) * bs;
      for (int hh = 0; hh < nh; ++hh) {
        for (int bi = 0; bi < nblk; ++bi)
          vtl[bi] = cache + ((int64_t)bt[b0 + bi] * a.num_kv_heads + h0 + hh) * 2 * tile + tile;
        const size_t r0 = (size_t)hh * hrows;
        if (R) {
          if (nt_last % 16) amx_v_tail(vtl[nblk - 1], nt_last & ~15, nt_last, vz);
          pv_amx(vtl, nblk, nt_last, hrows, R, pb + r0 * ct, acc + r0 * D, vz);
        } else {
          pv(vtl, nblk, nt_last, hrows, s + r0 * ct, pb + r0 * ct, acc + r0 * D);
        }
      }
    }
    if (R) amx_end();

    T* out = (T*)a.out;
    for (int r = 0; r < rows; ++r) {
      const int hh = r / hrows, jj = (r / G) % nq, g = r % G;
      T* o = out + (qs + j0 + jj) * a.o_stride + (int64_t)((h0 + hh) * G + g) * D;
      const F inv = bcast(1.f / l[r]);
      const float* ar = acc + (size_t)r * D;
      for (int d = 0; d < D; d += 16) E::store16(o + d, mul(load(ar + d), inv));
    }
  }

  struct Item {
    int32_t req, h0, nh, qt;
  };

  static void item_fn(void* ctx, int64_t i, int /*tid*/) {
    auto* self = (const PagedAttention*)((void**)ctx)[0];
    const Item* items = (const Item*)((void**)ctx)[1];
    char* scratch = tls_scratch.get(self->scratch_bytes);
    if (scratch == nullptr) {
      self->out_of_memory.store(true, std::memory_order_relaxed);
      return;
    }
    const Item& it = items[i];
    self->run(it.req, it.h0, it.nh, it.qt, scratch);
  }

  mutable std::atomic<bool> out_of_memory{false};

  // a.write's tokens of requests that are not decodes (the items write the decodes' own)
  const char* write_non_decodes() const {
    const WriteKVArgs& w = *a.write;
    int n_dec = 0;
    for (int i = 0; i < a.num_reqs; ++i)
      n_dec += a.query_start_loc[i + 1] - a.query_start_loc[i] == 1 && a.query_start_loc[i] < w.num_tokens;
    if (n_dec == w.num_tokens) return nullptr;
    int64_t* slots = (int64_t*)malloc(sizeof(int64_t) * (w.num_tokens > 0 ? w.num_tokens : 1));
    if (slots == nullptr) return "out of memory (slot mapping)";
    memcpy(slots, w.slot_mapping, sizeof(int64_t) * w.num_tokens);
    for (int i = 0; i < a.num_reqs; ++i)
      if (a.query_start_loc[i + 1] - a.query_start_loc[i] == 1 && a.query_start_loc[i] < w.num_tokens)
        slots[a.query_start_loc[i]] = -1;
    WriteKVArgs rest = w;
    rest.slot_mapping = slots;
    WriteKV<DT>::run(rest);
    free(slots);
    return nullptr;
  }

  // nullptr, or why nothing (or not everything) was computed
  const char* operator()() const {
    // Work items: prefill tiles first (largest), decodes after, so the dynamic hand-out ends
    // with the small ones and the threads finish together. A decode covers all KV heads of
    // its sequence when there are enough sequences to keep every thread busy: each block is
    // then read as one contiguous stretch (num_kv_heads x K/V tiles) that the prefetchers
    // stream, instead of a 1/num_kv_heads slice of it.
    if (a.write)
      if (const char* e = write_non_decodes()) return e;
    const int threads = threading::resolve_threads(a.num_threads);
    int n_decode = 0;
    for (int i = 0; i < a.num_reqs; ++i)
      n_decode += (a.query_start_loc[i + 1] - a.query_start_loc[i]) == 1;
    const int dec_nh = n_decode >= 2 * threads ? a.num_kv_heads : 1;
    int64_t n_items = 0;
    for (int i = 0; i < a.num_reqs; ++i) {
      const int qlen = a.query_start_loc[i + 1] - a.query_start_loc[i];
      if (qlen == 1) n_items += a.num_kv_heads / dec_nh;
      else n_items += (int64_t)((qlen + QT - 1) / QT) * a.num_kv_heads;
    }
    if (n_items == 0) return nullptr;
    Item* items = (Item*)malloc(sizeof(Item) * n_items);
    if (items == nullptr) return "out of memory (work items)";
    int64_t k = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < a.num_reqs; ++i) {
        const int qlen = a.query_start_loc[i + 1] - a.query_start_loc[i];
        if (qlen == 0 || (pass == 0) != (qlen > 1)) continue;
        if (qlen == 1) {
          for (int h = 0; h < a.num_kv_heads; h += dec_nh) items[k++] = Item{i, h, dec_nh, 0};
          continue;
        }
        const int ntiles = (qlen + QT - 1) / QT;
        for (int qt = ntiles - 1; qt >= 0; --qt)
          for (int h = 0; h < a.num_kv_heads; ++h) items[k++] = Item{i, h, 1, qt};
      }
    }
    void* ctx[2] = {(void*)this, (void*)items};
    threading::parallel_run(n_items, threads, &item_fn, ctx);
    free(items);
    return out_of_memory.load() ? "out of memory (per-thread scratch)" : nullptr;
  }
};

// ------------------------------------------------------------------------------------------
// RMSNorm (+ residual), SiLU-and-mul, RoPE: rounded like the eager torch ops in layers.py

template <int DT>
struct SmallOps {
  using E = Elem<DT>;
  using T = typename E::T;

  // Rows per work item: items of about 32K elements, their count rounded up to a multiple of
  // the threads once there are 4K elements per thread, so a decode batch splits evenly (48 rows
  // of 576 were one item on one thread, 48 x 1536 three items on two).
  static int64_t chunk_rows(int64_t rows, int64_t n, int num_threads) {
    if (n < 1) n = 1;
    int64_t items = (rows * n + 32767) / 32768;
    const int64_t threads = threading::resolve_threads(num_threads);
    if (threads > 1 && rows * n >= 4096 * threads) items = (items + threads - 1) / threads * threads;
    if (items > rows) items = rows;
    return items < 1 ? 1 : (rows + items - 1) / items;
  }

  static void rms_item(void* ctx, int64_t item, int) {
    const RMSNormArgs& a = *(const RMSNormArgs*)ctx;
    const int64_t per = chunk_rows(a.rows, a.n, a.num_threads);
    const int64_t r0 = item * per, r1 = r0 + per < a.rows ? r0 + per : a.rows;
    const int n = a.n, nv = n & ~15;
    const T* w = (const T*)a.weight;
    for (int64_t row = r0; row < r1; ++row) {
      const T* x = (const T*)a.x + row * a.x_stride;
      const T* res = a.residual ? (const T*)a.residual + row * a.r_stride : nullptr;
      T* ro = a.residual ? (T*)a.residual_out + row * a.ro_stride : nullptr;
      T* out = (T*)a.out + row * a.o_stride;
      // pass 1: h = x (+ residual, rounded to T), sum of squares in fp32
      F ss = zero();
      float ss_tail = 0.f;
      for (int d = 0; d < nv; d += 16) {
        F h = E::load16(x + d);
        if (res) {
          h = round_to<DT>(add(h, E::load16(res + d)));
          E::store16(ro + d, h);
        }
        ss = fma(h, h, ss);
      }
      for (int d = nv; d < n; ++d) {
        float h = E::to_f(x[d]);
        if (res) {
          h = round_to1<DT>(h + E::to_f(res[d]));
          ro[d] = E::from_f(h);
        }
        ss_tail += h * h;
      }
      const float var = (hsum(ss) + ss_tail) / (float)n;
      const float inv = 1.f / sqrtf(var + a.eps);
      const T* src = res ? ro : x;
      const F iv = bcast(inv);
      for (int d = 0; d < nv; d += 16) {
        F h = round_to<DT>(mul(E::load16(src + d), iv));
        E::store16(out + d, mul(E::load16(w + d), h));
      }
      for (int d = nv; d < n; ++d) {
        float h = round_to1<DT>(E::to_f(src[d]) * inv);
        out[d] = E::from_f(E::to_f(w[d]) * h);
      }
    }
  }

  static void rms_norm(const RMSNormArgs& a) {
    const int64_t per = chunk_rows(a.rows, a.n, a.num_threads);
    const int64_t n_items = (a.rows + per - 1) / per;
    threading::parallel_run(n_items, n_items > 1 ? a.num_threads : 1, &rms_item, (void*)&a);
  }

  static inline float silu1(float g) { return g / (1.f + expf(-g)); }

  static void silu_item(void* ctx, int64_t item, int) {
    const SiluMulArgs& a = *(const SiluMulArgs*)ctx;
    const int64_t per = chunk_rows(a.rows, a.n, a.num_threads);
    const int64_t r0 = item * per, r1 = r0 + per < a.rows ? r0 + per : a.rows;
    const int n = a.n, nv = n & ~15;
    const F one = bcast(1.f);
    for (int64_t row = r0; row < r1; ++row) {
      const T* g = (const T*)a.x + row * a.x_stride;
      const T* u = g + n;
      T* out = (T*)a.out + row * a.o_stride;
      for (int d = 0; d < nv; d += 16) {
        F gv = E::load16(g + d);
        F s = round_to<DT>(div(gv, add(one, vexp(sub(zero(), gv)))));
        E::store16(out + d, mul(s, E::load16(u + d)));
      }
      for (int d = nv; d < n; ++d) {
        float s = round_to1<DT>(silu1(E::to_f(g[d])));
        out[d] = E::from_f(s * E::to_f(u[d]));
      }
    }
  }

  static void silu_and_mul(const SiluMulArgs& a) {
    const int64_t per = chunk_rows(a.rows, a.n, a.num_threads);
    const int64_t n_items = (a.rows + per - 1) / per;
    threading::parallel_run(n_items, n_items > 1 ? a.num_threads : 1, &silu_item, (void*)&a);
  }

  // out = round(round(x * cos) + round(rotate_half(x) * sin)); rotate_half(x) = [-x2, x1]
  static inline void rope_head(const T* x, T* o, const T* c, const T* s, int D) {
    const int half = D / 2;
    const int hv = half & ~15;
    for (int d = 0; d < hv; d += 16) {
      F x1 = E::load16(x + d), x2 = E::load16(x + half + d);
      F c1 = E::load16(c + d), c2 = E::load16(c + half + d);
      F s1 = E::load16(s + d), s2 = E::load16(s + half + d);
      F a1 = round_to<DT>(mul(x1, c1)), b1 = round_to<DT>(mul(sub(zero(), x2), s1));
      F a2 = round_to<DT>(mul(x2, c2)), b2 = round_to<DT>(mul(x1, s2));
      E::store16(o + d, add(a1, b1));
      E::store16(o + half + d, add(a2, b2));
    }
    for (int d = hv; d < half; ++d) {
      const float x1 = E::to_f(x[d]), x2 = E::to_f(x[half + d]);
      const float a1 = round_to1<DT>(x1 * E::to_f(c[d])), b1 = round_to1<DT>(-x2 * E::to_f(s[d]));
      const float a2 = round_to1<DT>(x2 * E::to_f(c[half + d])), b2 = round_to1<DT>(x1 * E::to_f(s[half + d]));
      o[d] = E::from_f(a1 + b1);
      o[half + d] = E::from_f(a2 + b2);
    }
  }

  static void rope_item(void* ctx, int64_t item, int) {
    const RopeArgs& a = *(const RopeArgs*)ctx;
    const int D = a.head_size;
    const int64_t per = chunk_rows(a.num_tokens, (int64_t)(a.num_q_heads + a.num_k_heads) * D, a.num_threads);
    const int64_t t0 = item * per, t1 = t0 + per < a.num_tokens ? t0 + per : a.num_tokens;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = a.positions[t];
      const T* c = (const T*)a.cos + pos * D;
      const T* s = (const T*)a.sin + pos * D;
      for (int h = 0; h < a.num_q_heads; ++h)
        rope_head((const T*)a.q + t * a.q_stride_tok + h * a.q_stride_head,
                  (T*)a.q_out + (t * a.num_q_heads + h) * D, c, s, D);
      for (int h = 0; h < a.num_k_heads; ++h)
        rope_head((const T*)a.k + t * a.k_stride_tok + h * a.k_stride_head,
                  (T*)a.k_out + (t * a.num_k_heads + h) * D, c, s, D);
    }
  }

  static void rope(const RopeArgs& a) {
    const int64_t per = chunk_rows(a.num_tokens, (int64_t)(a.num_q_heads + a.num_k_heads) * a.head_size, a.num_threads);
    const int64_t n_items = (a.num_tokens + per - 1) / per;
    threading::parallel_run(n_items, n_items > 1 ? a.num_threads : 1, &rope_item, (void*)&a);
  }
};

// ------------------------------------------------------------------------------------------
// Row argmax (the sampler's greedy pick): first maximum, a NaN counting as the maximum.
// One pass per row in chunks: a chunk's maximum by vector max, where a chunk holding no NaN or
// infinity (flagged by a running sum of x * 0) makes that exact; a flagged chunk is scanned in
// scalar (returning at a NaN: the row's first). Then the first chunk whose maximum is the row's
// is rescanned for the first element equal to it. Reads each element once, plus one chunk.

template <int DT>
struct RowArgmax {
  using E = Elem<DT>;
  using T = typename E::T;
  static constexpr int64_t kChunk = 512;  // elements, a multiple of 16

  // The chunk's maximum, or sets *nan to its first NaN's offset.
  static float chunk_max(const T* x, int64_t len, int64_t* nan) {
    const int64_t lv = len & ~(int64_t)15;
    float m = -INFINITY;
    if (lv) {
      F mv = E::load16(x), flag = zero();
      for (int64_t i = 0; i < lv; i += 16) {
        const F v = E::load16(x + i);
        mv = max(mv, v);
        flag = add(flag, mul(v, zero()));
      }
      const float f = hsum(flag);
      if (f == f) m = hmax(mv);
      else lv_scalar(x, lv, &m, nan);
      if (*nan >= 0) return m;
    }
    for (int64_t i = lv; i < len; ++i) {
      const float v = E::to_f(x[i]);
      if (v != v) { *nan = i; return m; }
      if (v > m) m = v;
    }
    return m;
  }

  static void lv_scalar(const T* x, int64_t len, float* m, int64_t* nan) {
    for (int64_t i = 0; i < len; ++i) {
      const float v = E::to_f(x[i]);
      if (v != v) { *nan = i; return; }
      if (v > *m) *m = v;
    }
  }

  static int64_t row(const T* x, int64_t n) {
    float best = -INFINITY;
    int64_t best_chunk = 0;
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      int64_t nan = -1;
      const float m = chunk_max(x + c0, n - c0 < kChunk ? n - c0 : kChunk, &nan);
      if (nan >= 0) return c0 + nan;
      if (m > best) { best = m; best_chunk = c0; }
    }
    const int64_t end = best_chunk + kChunk < n ? best_chunk + kChunk : n;
    for (int64_t i = best_chunk; i < end; ++i)
      if (E::to_f(x[i]) == best) return i;
    return best_chunk;  // every element -inf: the first
  }

  static void item(void* ctx, int64_t r, int) {
    const ArgmaxArgs& a = *(const ArgmaxArgs*)ctx;
    a.out[r] = row((const T*)a.x + r * a.x_stride, a.n);
  }

  static void run(const ArgmaxArgs& a) {
    threading::parallel_run(a.rows, a.rows > 1 && a.rows * a.n >= 16384 ? a.num_threads : 1, &item, (void*)&a);
  }
};

// ------------------------------------------------------------------------------------------
// entry points (dtype dispatch)

#define OCTAVO_DISPATCH_DTYPE(dt, ...)                       \
  switch (dt) {                                              \
    case kFloat32: { constexpr int DT = kFloat32; __VA_ARGS__; break; }   \
    case kFloat16: { constexpr int DT = kFloat16; __VA_ARGS__; break; }   \
    case kBFloat16: { constexpr int DT = kBFloat16; __VA_ARGS__; break; } \
    default: break;                                          \
  }

static const char* isa_name() { return kIsaName; }
static const char* check_shape(int dtype, int head_size, int block_size) {
  if (dtype != kFloat32 && dtype != kFloat16 && dtype != kBFloat16) return "unsupported dtype";
  if (head_size <= 0 || head_size % 16 || head_size > 512) return "head size must be a multiple of 16 up to 512";
  if (block_size <= 0 || block_size % 16 || block_size > 256)
    return "block size must be a multiple of 16 up to 256";
  return nullptr;
}
static const char* paged_attention(const PagedAttentionArgs& a) {
  if (const char* e = check_shape(a.dtype, a.head_size, a.block_size)) return e;
  if (a.write && (a.write->dtype != a.dtype || a.write->head_size != a.head_size ||
                  a.write->block_size != a.block_size || a.write->num_kv_heads != a.num_kv_heads ||
                  a.write->kv_cache != a.kv_cache))
    return "the K/V to write do not match the attention's cache";
  if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads) return "num_heads must be a multiple of num_kv_heads";
  const char* err = nullptr;
  OCTAVO_DISPATCH_DTYPE(a.dtype, err = PagedAttention<DT>{a}());
  return err;
}
static const char* write_kv(const WriteKVArgs& a) {
  if (const char* e = check_shape(a.dtype, a.head_size, a.block_size)) return e;
  OCTAVO_DISPATCH_DTYPE(a.dtype, WriteKV<DT>::run(a));
  return nullptr;
}
static void rms_norm(const RMSNormArgs& a) { OCTAVO_DISPATCH_DTYPE(a.dtype, SmallOps<DT>::rms_norm(a)); }
static void silu_and_mul(const SiluMulArgs& a) {
  OCTAVO_DISPATCH_DTYPE(a.dtype, SmallOps<DT>::silu_and_mul(a));
}
static void rope(const RopeArgs& a) { OCTAVO_DISPATCH_DTYPE(a.dtype, SmallOps<DT>::rope(a)); }
static void row_argmax(const ArgmaxArgs& a) { OCTAVO_DISPATCH_DTYPE(a.dtype, RowArgmax<DT>::run(a)); }

// The table this ISA's translation unit exports (kernels.cpp).
const Kernels* kernels() {
  static const Kernels table = {kIsaName, kHasBf16Dot, &paged_attention, &write_kv,
                                &rms_norm, &silu_and_mul, &rope, &attention_amx_ready,
                                &row_argmax};
  (void)&isa_name;
  return &table;
}

#undef OCTAVO_DISPATCH_DTYPE

}  // namespace OCTAVO_ISA_NS
}  // namespace octavo
