// Standalone test of octavo's CPU kernels against a scalar double-precision reference.
//
// The binary links every ISA variant built for its architecture (x86-64: avx512_bf16, avx512,
// avx2, scalar; aarch64: neon, scalar), each compiled from csrc/cpu/kernels.cpp with its own
// flags into its own namespace. A CPUID/HWCAP dispatcher picks the best variant the CPU runs,
// exactly like octavo.cpu_isa does; the tests then run every variant the CPU can execute and
// never call one it cannot. Run under `qemu-x86_64 -cpu Haswell` this proves the dispatcher
// picks AVX2 and that no AVX-512 instruction executes (qemu's TCG has no AVX-512: one would be
// a SIGILL); under `qemu-aarch64` it checks the NEON kernels.
//
//   test_kernels [--expect-isa NAME] [--quick] [--bench] [--force VARIANT]
// --force runs one variant whatever the CPU says (the negative control: under qemu -cpu Haswell
// `--force avx512` must die with SIGILL, which shows the emulator really traps AVX-512).
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <string>
#include <vector>

#include "api.h"
#include "cpu_features.h"
#include "gemv.h"
#include "scalar_convert.h"

extern "C" void GOMP_parallel(void (*)(void*), void*, unsigned, unsigned);

#define DECLARE_VARIANT(ns) \
  namespace octavo { namespace ns { const Kernels* kernels(); void gemv_bf16(const GemvArgs&); } }
#if defined(__x86_64__)
DECLARE_VARIANT(isa_avx512_bf16)
DECLARE_VARIANT(isa_avx512)
DECLARE_VARIANT(isa_avx2)
#elif defined(__aarch64__)
DECLARE_VARIANT(isa_neon)
#endif
DECLARE_VARIANT(isa_scalar)

using octavo::Kernels;

struct Variant {
  const char* name;
  const Kernels* (*get)();
  void (*gemv)(const octavo::GemvArgs&);
};

static std::vector<Variant> all_variants() {
  return {
#if defined(__x86_64__)
      {"avx512_bf16", &octavo::isa_avx512_bf16::kernels, &octavo::isa_avx512_bf16::gemv_bf16},
      {"avx512", &octavo::isa_avx512::kernels, &octavo::isa_avx512::gemv_bf16},
      {"avx2", &octavo::isa_avx2::kernels, &octavo::isa_avx2::gemv_bf16},
#elif defined(__aarch64__)
      {"neon", &octavo::isa_neon::kernels, &octavo::isa_neon::gemv_bf16},
#endif
      {"scalar", &octavo::isa_scalar::kernels, &octavo::isa_scalar::gemv_bf16},
  };
}

static bool runs_here(const std::string& v, const octavo::CpuFeatures& f) {
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c;
  if (v == "avx512_bf16") return avx512 && f.avx512bf16;
  if (v == "avx512") return avx512;
  if (v == "avx2") return f.avx2 && f.fma && f.f16c;
  if (v == "neon") return f.neon;
  return v == "scalar";
}

// ---------------------------------------------------------------------------------------
// data helpers

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand() {  // [0, 1)
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static float nrand() { return (float)((urand() + urand() + urand() + urand() - 2.0) * 1.7); }

static int elem_size(int dt) { return dt == octavo::kFloat32 ? 4 : 2; }
static double get(const void* p, int64_t i, int dt) {
  if (dt == octavo::kFloat32) return ((const float*)p)[i];
  uint16_t h = ((const uint16_t*)p)[i];
  return dt == octavo::kBFloat16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
}
static void put(void* p, int64_t i, int dt, float x) {
  if (dt == octavo::kFloat32) ((float*)p)[i] = x;
  else ((uint16_t*)p)[i] = dt == octavo::kBFloat16 ? f32_to_bf16_bits(x) : f32_to_f16_bits(x);
}
struct Buf {
  std::vector<unsigned char> bytes;
  int dt;
  Buf(int64_t n, int dt_) : bytes(n * elem_size(dt_)), dt(dt_) {}
  void* p() { return bytes.data(); }
  double at(int64_t i) const { return get(bytes.data(), i, dt); }
  void set(int64_t i, float x) { put(bytes.data(), i, dt, x); }
  void randomize() {
    for (int64_t i = 0; i < (int64_t)(bytes.size() / elem_size(dt)); ++i) set(i, nrand());
  }
};
static const char* dt_name(int dt) {
  return dt == octavo::kFloat32 ? "fp32" : dt == octavo::kBFloat16 ? "bf16" : "fp16";
}

// the cpu_paged layout (csrc/cpu/api.h)
static int64_t k_index(int64_t blk, int h, int t, int d, int Hk, int bs, int D, int P) {
  return (blk * Hk + h) * 2 * bs * D + (int64_t)(d / P) * bs * P + t * P + d % P;
}
static int64_t v_index(int64_t blk, int h, int t, int d, int Hk, int bs, int D, int P) {
  return (blk * Hk + h) * 2 * bs * D + (int64_t)bs * D + (int64_t)(t / P) * D * P + d * P + t % P;
}

static int failures = 0;
#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) {                        \
      ++failures;                         \
      printf("  FAIL: " __VA_ARGS__);     \
      printf("\n");                       \
    }                                     \
  } while (0)

// ---------------------------------------------------------------------------------------
// paged attention + write_kv vs the reference

struct Case {
  std::vector<int> ctx, qlen;
  int H, Hk, D, bs, dt;
};

static double run_attention_case(const Kernels* k, const Case& c, bool check_write) {
  const int B = (int)c.ctx.size();
  const int D = c.D, bs = c.bs, H = c.H, Hk = c.Hk, G = H / Hk, P = 4 / elem_size(c.dt);
  std::vector<int32_t> qsl(B + 1, 0), seq(B);
  int max_blocks = 0;
  for (int i = 0; i < B; ++i) {
    qsl[i + 1] = qsl[i] + c.qlen[i];
    seq[i] = c.ctx[i] + c.qlen[i];
    int nb = (seq[i] + bs - 1) / bs;
    if (nb > max_blocks) max_blocks = nb;
  }
  const int T = qsl[B];
  // random block assignment (block 0 = null, never used)
  int nblocks = 1;
  std::vector<int32_t> bt((size_t)B * (max_blocks + 1), 0);
  for (int i = 0; i < B; ++i)
    for (int b = 0; b < (seq[i] + bs - 1) / bs; ++b) bt[(size_t)i * (max_blocks + 1) + b] = nblocks++;
  nblocks += 2;
  std::vector<int32_t> perm(nblocks);  // shuffle the ids so tables are not sequential
  for (int b = 0; b < nblocks; ++b) perm[b] = b;
  for (int b = nblocks - 1; b > 1; --b) {
    int r = 1 + (int)(urand() * b);
    int t = perm[b]; perm[b] = perm[r]; perm[r] = t;
  }
  for (auto& x : bt) x = perm[x];
  Buf cache((int64_t)nblocks * Hk * 2 * bs * D, c.dt);
  cache.randomize();
  Buf q((int64_t)T * H * D, c.dt), kk((int64_t)T * Hk * D, c.dt), vv((int64_t)T * Hk * D, c.dt);
  q.randomize();
  kk.randomize();
  vv.randomize();
  std::vector<int64_t> slots(T);
  for (int i = 0; i < B; ++i)
    for (int j = 0; j < c.qlen[i]; ++j) {
      int pos = c.ctx[i] + j;
      slots[qsl[i] + j] = (int64_t)bt[(size_t)i * (max_blocks + 1) + pos / bs] * bs + pos % bs;
    }
  Buf expect_cache = cache;
  for (int t = 0; t < T; ++t) {
    int64_t blk = slots[t] / bs;
    int off = (int)(slots[t] % bs);
    for (int h = 0; h < Hk; ++h)
      for (int d = 0; d < D; ++d) {
        expect_cache.set(k_index(blk, h, off, d, Hk, bs, D, P), (float)kk.at(((int64_t)t * Hk + h) * D + d));
        expect_cache.set(v_index(blk, h, off, d, Hk, bs, D, P), (float)vv.at(((int64_t)t * Hk + h) * D + d));
      }
  }
  octavo::WriteKVArgs w;
  w.key = kk.p(); w.k_stride_tok = (int64_t)Hk * D; w.k_stride_head = D;
  w.value = vv.p(); w.v_stride_tok = (int64_t)Hk * D; w.v_stride_head = D;
  w.kv_cache = cache.p(); w.slot_mapping = slots.data(); w.num_tokens = T;
  w.num_kv_heads = Hk; w.head_size = D; w.block_size = bs; w.dtype = c.dt;
  w.num_threads = 0;
  CHECK(k->write_kv(w) == nullptr, "write_kv rejected its arguments");
  if (check_write)
    CHECK(cache.bytes == expect_cache.bytes, "write_kv %s D=%d bs=%d: cache differs", dt_name(c.dt), D, bs);

  Buf out((int64_t)T * H * D, c.dt);
  octavo::PagedAttentionArgs a;
  a.query = q.p(); a.q_stride = (int64_t)H * D; a.out = out.p(); a.o_stride = (int64_t)H * D;
  a.kv_cache = cache.p(); a.query_start_loc = qsl.data(); a.seq_lens = seq.data();
  a.block_table = bt.data(); a.bt_stride = max_blocks + 1; a.num_reqs = B; a.num_heads = H;
  a.num_kv_heads = Hk; a.head_size = D; a.block_size = bs; a.scale = (float)(1.0 / sqrt((double)D));
  a.dtype = c.dt; a.num_threads = 0;
  CHECK(k->paged_attention(a) == nullptr, "paged_attention rejected its arguments");

  // reference (double), relative Frobenius error over the whole output
  double num = 0, den = 0;
  std::vector<double> sc, o(D);
  for (int i = 0; i < B; ++i) {
    const int32_t* row = &bt[(size_t)i * (max_blocks + 1)];
    for (int j = 0; j < c.qlen[i]; ++j) {
      const int pos = c.ctx[i] + j, tok = qsl[i] + j;
      for (int hq = 0; hq < H; ++hq) {
        const int h = hq / G;
        sc.assign(pos + 1, 0.0);
        double mx = -1e300;
        for (int t = 0; t <= pos; ++t) {
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += q.at(((int64_t)tok * H + hq) * D + d) * expect_cache.at(k_index(row[t / bs], h, t % bs, d, Hk, bs, D, P));
          sc[t] = s * a.scale;
          if (sc[t] > mx) mx = sc[t];
        }
        double l = 0;
        for (int t = 0; t <= pos; ++t) l += (sc[t] = exp(sc[t] - mx));
        for (int d = 0; d < D; ++d) o[d] = 0;
        for (int t = 0; t <= pos; ++t)
          for (int d = 0; d < D; ++d) o[d] += sc[t] / l * expect_cache.at(v_index(row[t / bs], h, t % bs, d, Hk, bs, D, P));
        for (int d = 0; d < D; ++d) {
          double got = out.at(((int64_t)tok * H + hq) * D + d);
          num += (got - o[d]) * (got - o[d]);
          den += o[d] * o[d];
        }
      }
    }
  }
  return sqrt(num / (den > 0 ? den : 1));
}

static double tol(int dt) { return dt == octavo::kFloat32 ? 1e-5 : dt == octavo::kFloat16 ? 2e-3 : 1e-2; }

static void test_attention(const Kernels* k, bool quick) {
  const int dts[] = {octavo::kFloat32, octavo::kBFloat16, octavo::kFloat16};
  const int heads[] = {32, 64, 80, 96, 128, 256};
  const int blocks[] = {16, 32, 64, 128};
  int n = 0;
  for (int dt : dts)
    for (int D : heads)
      for (int bs : blocks) {
        if (quick && (bs == 32 || bs == 64)) continue;
        Case c;
        // mixed batch: prefill from scratch, chunked prefill over a cached prefix, decodes
        c.ctx = {0, 17, 30, 0, bs - 1, bs, 3 * bs + 5};
        c.qlen = {5, 1, 12, 1, 1, 2 * bs + 3, 1};
        if (quick) { c.ctx.resize(5); c.qlen.resize(5); }
        c.H = D >= 256 ? 4 : 6;
        c.Hk = D >= 256 ? 2 : 2;
        c.D = D;
        c.bs = bs;
        c.dt = dt;
        double err = run_attention_case(k, c, true);
        CHECK(err < tol(dt), "attention %s %s D=%d bs=%d: rel err %.2e", k->isa, dt_name(dt), D, bs, err);
        ++n;
      }
  // GQA extremes: MHA (G=1) and a large group (G=8)
  for (int dt : dts) {
    Case c;
    c.ctx = {0, 40, 7};
    c.qlen = {9, 1, 20};
    c.H = 8; c.Hk = 1; c.D = 64; c.bs = 16; c.dt = dt;
    double err = run_attention_case(k, c, false);
    CHECK(err < tol(dt), "attention %s %s G=8: rel err %.2e", k->isa, dt_name(dt), err);
    c.H = 3; c.Hk = 3;
    err = run_attention_case(k, c, false);
    CHECK(err < tol(dt), "attention %s %s G=1: rel err %.2e", k->isa, dt_name(dt), err);
    n += 2;
  }
  printf("  attention + write_kv: %d cases\n", n);
}

// ---------------------------------------------------------------------------------------
// small ops vs scalar references (rounded like the eager torch code)

static float rnd(float x, int dt) {
  if (dt == octavo::kFloat32) return x;
  return dt == octavo::kBFloat16 ? bf16_bits_to_f32(f32_to_bf16_bits(x)) : f16_bits_to_f32(f32_to_f16_bits(x));
}

static void test_small_ops(const Kernels* k) {
  const int dts[] = {octavo::kFloat32, octavo::kBFloat16, octavo::kFloat16};
  for (int dt : dts) {
    const double tl = dt == octavo::kFloat32 ? 1e-5 : 1e-2;
    // RMSNorm with residual, n not a multiple of 16
    for (int n : {576, 72, 37}) {
      const int rows = 5;
      Buf x(rows * n, dt), r(rows * n, dt), w(n, dt), out(rows * n, dt), ro(rows * n, dt);
      x.randomize(); r.randomize(); w.randomize();
      octavo::RMSNormArgs a;
      a.x = x.p(); a.x_stride = n; a.residual = r.p(); a.r_stride = n; a.weight = w.p();
      a.out = out.p(); a.o_stride = n; a.residual_out = ro.p(); a.ro_stride = n;
      a.rows = rows; a.n = n; a.eps = 1e-5f; a.dtype = dt; a.num_threads = 0;
      k->rms_norm(a);
      double num = 0, den = 0, rnum = 0;
      for (int i = 0; i < rows; ++i) {
        double ss = 0;
        std::vector<float> h(n);
        for (int d = 0; d < n; ++d) {
          h[d] = rnd((float)(x.at(i * n + d) + r.at(i * n + d)), dt);
          ss += (double)h[d] * h[d];
          rnum += fabs(ro.at(i * n + d) - h[d]);
        }
        const double inv = 1.0 / sqrt(ss / n + 1e-5);
        for (int d = 0; d < n; ++d) {
          double e = w.at(d) * rnd((float)(h[d] * inv), dt);
          double g = out.at(i * n + d);
          num += (g - e) * (g - e);
          den += e * e;
        }
      }
      CHECK(rnum == 0, "rms_norm %s n=%d: residual sum not exact", dt_name(dt), n);
      CHECK(sqrt(num / den) < tl, "rms_norm %s n=%d: rel err %.2e", dt_name(dt), n, sqrt(num / den));
    }
    // SiLU(gate) * up
    for (int n : {1536, 40}) {
      const int rows = 3;
      Buf x(rows * 2 * n, dt), out(rows * n, dt);
      x.randomize();
      octavo::SiluMulArgs a;
      a.x = x.p(); a.x_stride = 2 * n; a.out = out.p(); a.o_stride = n; a.rows = rows; a.n = n;
      a.dtype = dt; a.num_threads = 0;
      k->silu_and_mul(a);
      double num = 0, den = 0;
      for (int i = 0; i < rows; ++i)
        for (int d = 0; d < n; ++d) {
          double g = x.at(i * 2 * n + d), u = x.at(i * 2 * n + n + d);
          double e = rnd((float)(g / (1 + exp(-g))), dt) * u;
          double o = out.at(i * n + d);
          num += (o - e) * (o - e);
          den += e * e;
        }
      CHECK(sqrt(num / den) < tl, "silu_and_mul %s n=%d: rel err %.2e", dt_name(dt), n, sqrt(num / den));
    }
    // RoPE (neox) with strided q/k
    for (int D : {64, 80, 128}) {
      const int T = 4, Hq = 3, Hkk = 1, maxpos = 50, stride = (Hq + 2 * Hkk) * D;
      Buf qkv(T * stride, dt), cs(maxpos * D, dt), sn(maxpos * D, dt), qo(T * Hq * D, dt), ko(T * Hkk * D, dt);
      qkv.randomize(); cs.randomize(); sn.randomize();
      std::vector<int64_t> pos = {0, 7, 49, 3};
      octavo::RopeArgs a;
      a.q = qkv.p(); a.q_stride_tok = stride; a.q_stride_head = D;
      a.k = (char*)qkv.p() + (size_t)Hq * D * elem_size(dt); a.k_stride_tok = stride; a.k_stride_head = D;
      a.q_out = qo.p(); a.k_out = ko.p(); a.positions = pos.data(); a.cos = cs.p(); a.sin = sn.p();
      a.num_tokens = T; a.num_q_heads = Hq; a.num_k_heads = Hkk; a.head_size = D; a.dtype = dt;
      a.num_threads = 0;
      k->rope(a);
      double num = 0, den = 0;
      const int half = D / 2;
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < Hq + Hkk; ++h)
          for (int d = 0; d < D; ++d) {
            const int64_t base = (int64_t)t * stride + (int64_t)h * D;
            double xd = qkv.at(base + d);
            double rh = d < half ? -qkv.at(base + d + half) : qkv.at(base + d - half);
            double e = rnd((float)(rnd((float)(xd * cs.at(pos[t] * D + d)), dt) +
                                   rnd((float)(rh * sn.at(pos[t] * D + d)), dt)), dt);
            double o = h < Hq ? qo.at(((int64_t)t * Hq + h) * D + d) : ko.at(((int64_t)t * Hkk + h - Hq) * D + d);
            num += (o - e) * (o - e);
            den += e * e;
          }
      CHECK(sqrt(num / den) < (dt == octavo::kFloat32 ? 1e-6 : 1e-3), "rope %s D=%d: rel err %.2e", dt_name(dt), D, sqrt(num / den));
    }
  }
  printf("  rms_norm / silu_and_mul / rope: ok\n");
}

// Row argmax: the first maximum, a NaN counting as the maximum (torch.argmax), across chunk
// boundaries, with ties, infinities and a tail shorter than a vector.
static void test_row_argmax(const Kernels* k) {
  const int dts[] = {octavo::kFloat32, octavo::kBFloat16, octavo::kFloat16};
  for (int dt : dts) {
    const int rows = 9, n = 2063;
    Buf x(rows * n, dt);
    for (int64_t i = 0; i < rows * n; ++i) x.set(i, (float)(int)(nrand() * 2));  // many ties
    x.set(1 * n + 1500, 50.f); x.set(1 * n + 1700, 50.f);        // tie across chunks: 1500
    x.set(2 * n + 900, NAN); x.set(2 * n + 100, 60.f);            // NaN wins: 900
    x.set(3 * n + 2062, 70.f);                                    // in the tail: 2062
    x.set(4 * n + 10, INFINITY); x.set(4 * n + 5, INFINITY);      // +inf tie: 5
    for (int j = 0; j < n; ++j) x.set(5 * n + j, -INFINITY);      // all -inf: 0
    x.set(6 * n + 3, NAN); x.set(6 * n + 2000, NAN);              // first NaN: 3
    std::vector<int64_t> out(rows, -1);
    octavo::ArgmaxArgs a;
    a.x = x.p(); a.x_stride = n; a.out = out.data(); a.rows = rows; a.n = n; a.dtype = dt; a.num_threads = 0;
    k->row_argmax(a);
    for (int r = 0; r < rows; ++r) {
      int64_t e = 0;
      double best = x.at((int64_t)r * n);
      for (int j = 0; j < n && best == best; ++j) {
        const double v = x.at((int64_t)r * n + j);
        if (v > best || v != v) { best = v; e = j; }
      }
      CHECK(out[r] == e, "row_argmax %s row %d: %lld, expected %lld", dt_name(dt), r, (long long)out[r], (long long)e);
    }
  }
  printf("  row_argmax: ok\n");
}

// ---------------------------------------------------------------------------------------

static int bench_seqs = 32, bench_ctx = 1024, bench_dt = octavo::kBFloat16;
static int bench_h = 32, bench_hk = 8, bench_d = 128;
static void bench(const Kernels* k) {
  // decode: 32 seqs x 1024 context, 32 q heads, 8 kv heads, head 128, bf16
  Case c;
  c.H = bench_h; c.Hk = bench_hk; c.D = bench_d; c.dt = bench_dt;
  for (int bs : {16, 32, 64, 128}) {
    c.bs = bs;
    const int B = bench_seqs, D = bench_d, H = bench_h, Hk = bench_hk;
    const int nb = (bench_ctx + 1 + bs - 1) / bs;
    std::vector<int32_t> qsl(B + 1), seq(B, bench_ctx + 1), bt((size_t)B * nb);
    for (int i = 0; i <= B; ++i) qsl[i] = i;
    for (size_t i = 0; i < bt.size(); ++i) bt[i] = (int32_t)i + 1;
    Buf cache((int64_t)(bt.size() + 1) * Hk * 2 * bs * D, c.dt), q(B * H * D, c.dt), out(B * H * D, c.dt);
    cache.randomize();
    q.randomize();
    octavo::PagedAttentionArgs a;
    a.query = q.p(); a.q_stride = H * D; a.out = out.p(); a.o_stride = H * D; a.kv_cache = cache.p();
    a.query_start_loc = qsl.data(); a.seq_lens = seq.data(); a.block_table = bt.data(); a.bt_stride = nb;
    a.num_reqs = B; a.num_heads = H; a.num_kv_heads = Hk; a.head_size = D; a.block_size = bs;
    a.scale = 0.088f; a.dtype = c.dt; a.num_threads = 0;
    k->paged_attention(a);
    double best = 1e9;
    for (int r = 0; r < 50; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      k->paged_attention(a);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (ms < best) best = ms;
    }
    const double flops = 4.0 * B * H * (bench_ctx + 1) * D;
    printf("  bench %s bs=%d: %.3f ms (best of 50), %.1f GFLOP/s\n", k->isa, bs, best, flops / best / 1e6);
  }
}

// bf16 GEMV (gemv.h) against a double-precision reference of the same bf16 inputs.
static void test_gemv(const char* isa, void (*gemv)(const octavo::GemvArgs&)) {
  const int shapes[][3] = {{1, 16, 2}, {3, 48, 64}, {4, 576, 576}, {5, 80, 96}, {1, 4112, 256}};
  for (const auto& s : shapes) {
    const int m = s[0], n = s[1], k = s[2];
    std::vector<uint16_t> x(m * k), w(n * k), packed(n * k), bias(n), out(m * n);
    for (auto& v : x) put(&v, 0, octavo::kBFloat16, nrand());
    for (auto& v : w) put(&v, 0, octavo::kBFloat16, nrand() / 8);
    for (auto& v : bias) put(&v, 0, octavo::kBFloat16, nrand());
    for (int r = 0; r < n; ++r)  // [n/16, k/2, 16, 2]
      for (int c = 0; c < k; ++c) packed[((r / 16) * (k / 2) + c / 2) * 32 + (r % 16) * 2 + c % 2] = w[r * k + c];
    octavo::GemvArgs a{x.data(), k, packed.data(), bias.data(), out.data(), n, m, n, k, 2};
    gemv(a);
    double worst = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = get(bias.data(), j, octavo::kBFloat16);
        for (int c = 0; c < k; ++c) ref += get(x.data(), i * k + c, octavo::kBFloat16) * get(w.data(), j * k + c, octavo::kBFloat16);
        const double err = fabs(get(out.data(), i * n + j, octavo::kBFloat16) - ref) / (1.0 + fabs(ref));
        if (err > worst) worst = err;
      }
    const bool ok = worst < 1e-2;
    if (!ok) ++failures;
    printf("  gemv m=%d n=%d k=%d: max rel err %.2e %s\n", m, n, k, worst, ok ? "ok" : "FAIL");
  }
  (void)isa;
}

int main(int argc, char** argv) {
  octavo::threading::set_openmp((void*)&GOMP_parallel, (void*)&omp_get_thread_num,
                                (void*)&omp_get_max_threads);
  std::string expect, force;
  bool quick = false, do_bench = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--expect-isa") && i + 1 < argc) expect = argv[++i];
    else if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--force") && i + 1 < argc) force = argv[++i];
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-seqs") && i + 1 < argc) bench_seqs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bench-ctx") && i + 1 < argc) bench_ctx = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bench-fp32")) bench_dt = octavo::kFloat32;
    else if (!strcmp(argv[i], "--bench-shape") && i + 3 < argc) {
      bench_h = atoi(argv[++i]); bench_hk = atoi(argv[++i]); bench_d = atoi(argv[++i]);
    }
  }
  const octavo::CpuFeatures f = octavo::detect_cpu_features();
  const char* best = octavo::best_isa(f);
  printf("cpu features: avx2=%d fma=%d f16c=%d avx512f=%d bw=%d vl=%d dq=%d avx512_bf16=%d neon=%d\n",
         f.avx2, f.fma, f.f16c, f.avx512f, f.avx512bw, f.avx512vl, f.avx512dq, f.avx512bf16, f.neon);
  printf("dispatcher picks: %s\n", best);
  if (!expect.empty() && expect != best) {
    printf("FAIL: expected the dispatcher to pick %s\n", expect.c_str());
    return 1;
  }
  for (const Variant& v : all_variants()) {
    if (!force.empty()) {
      if (force != v.name) continue;
      printf("[%s] forced\n", v.name);
      fflush(stdout);
      test_attention(v.get(), true);
      continue;
    }
    if (!runs_here(v.name, f)) {
      printf("[%s] skipped: this CPU cannot run it\n", v.name);
      continue;
    }
    const Kernels* k = v.get();
    printf("[%s]%s\n", k->isa, !strcmp(v.name, best) ? " (dispatched)" : "");
    if (do_bench) {
      bench(k);
      continue;
    }
    test_attention(k, quick);
    test_small_ops(k);
    test_row_argmax(k);
    test_gemv(k->isa, v.gemv);
  }
  if (failures) {
    printf("%d FAILURES\n", failures);
    return 1;
  }
  printf("all passed\n");
  return 0;
}
