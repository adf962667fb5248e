// Standalone test of the weight-only INT8 / INT4 linear kernels (csrc/cpu/quant_impl.h) against
// a double-precision reference, for every ISA variant linked in (x86-64: avx512_bf16, avx512,
// avx2, scalar; aarch64: neon, scalar) that this CPU runs. Built by tests/csrc/build.sh next to
// test_kernels; `nox -s test-cpu-isa` runs it natively, under `qemu-x86_64 -cpu Haswell` (AVX2)
// and under `qemu-aarch64` (NEON), where the Python tests cannot go.
//
//   test_quant [--expect-isa NAME]
// The packed layout is built here the way octavo/quantization/kernels/cpu_int.py builds it.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#include "api.h"
#include "cpu_features.h"
#include "quant_api.h"
#include "scalar_convert.h"

extern "C" void GOMP_parallel(void (*)(void*), void*, unsigned, unsigned);

#define DECLARE_VARIANT(ns) \
  namespace octavo { namespace ns { const QuantKernels* quant_kernels(); } }
#if defined(__x86_64__)
DECLARE_VARIANT(isa_avx512_bf16)
DECLARE_VARIANT(isa_avx512)
DECLARE_VARIANT(isa_avx2)
#elif defined(__aarch64__)
DECLARE_VARIANT(isa_neon)
#endif
DECLARE_VARIANT(isa_scalar)

using octavo::QuantKernels;

struct Variant {
  const char* name;
  const QuantKernels* (*get)();
};

static std::vector<Variant> all_variants() {
  return {
#if defined(__x86_64__)
      {"avx512_bf16", &octavo::isa_avx512_bf16::quant_kernels},
      {"avx512", &octavo::isa_avx512::quant_kernels},
      {"avx2", &octavo::isa_avx2::quant_kernels},
#elif defined(__aarch64__)
      {"neon", &octavo::isa_neon::quant_kernels},
#endif
      {"scalar", &octavo::isa_scalar::quant_kernels},
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

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t next_u32() {
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}
static float uniform() { return (float)(next_u32() % 1000000) / 1000000.f; }

struct Case { int n, k, group, bits, m; bool sym; int dtype; int dp_min_rows; };
static int failures = 0;

static void run_case(const QuantKernels* qk, const Case& c) {
  const int T = octavo::kQuantTile, G = c.k / c.group, tiles = (c.n + T - 1) / T;
  const int rows = c.bits == 8 ? c.k : (c.k + 1) / 2;
  std::vector<uint8_t> q((size_t)c.n * c.k), z((size_t)c.n * G);
  std::vector<float> s((size_t)c.n * G), x((size_t)c.m * c.k);
  for (auto& v : q) v = (uint8_t)(next_u32() % (1u << c.bits));
  for (auto& v : z) v = c.sym ? (uint8_t)(1u << (c.bits - 1)) : (uint8_t)(next_u32() % (1u << c.bits));
  for (auto& v : s) v = 0.001f + 0.02f * uniform();
  for (auto& v : x) v = 2.f * uniform() - 1.f;
  if (c.dtype == octavo::kBFloat16)
    for (auto& v : x) v = bf16_bits_to_f32(f32_to_bf16_bits(v));
  // pack (cpu_int.prepack_int's layout)
  std::vector<uint8_t> w((size_t)tiles * rows * T, 0);
  std::vector<float> ps((size_t)tiles * G * T, 0.f), pz((size_t)tiles * G * T, 0.f);
  for (int n = 0; n < c.n; ++n) {
    const int t = n / T, j = n % T;
    for (int k = 0; k < c.k; ++k) {
      uint8_t& b = w[((size_t)t * rows + (c.bits == 8 ? k : k / 2)) * T + j];
      b |= c.bits == 8 ? q[(size_t)n * c.k + k] : (uint8_t)(q[(size_t)n * c.k + k] << (4 * (k % 2)));
    }
    for (int g = 0; g < G; ++g) {
      ps[((size_t)t * G + g) * T + j] = s[(size_t)n * G + g];
      pz[((size_t)t * G + g) * T + j] = z[(size_t)n * G + g];
    }
  }
  std::vector<uint16_t> xb((size_t)c.m * c.k), ob((size_t)c.m * c.n);
  std::vector<float> of((size_t)c.m * c.n);
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16_bits(x[i]);
  const bool bf = c.dtype == octavo::kBFloat16;
  octavo::IntLinearArgs a{};
  a.w = {w.data(), ps.data(), pz.data(), c.n, c.k, c.group, c.bits};
  a.x = bf ? (const void*)xb.data() : (const void*)x.data();
  a.x_stride = c.k;
  a.out = bf ? (void*)ob.data() : (void*)of.data();
  a.o_stride = c.n;
  a.m = c.m;
  a.dtype = c.dtype;
  a.num_threads = 2;
  a.allow_amx = 1;  // as the Python wrapper: bf16 batches of >= 5 rows on AMX where the CPU has it
  a.dp_min_rows = c.dp_min_rows;  // > 0: the VDPBF16PS kernel from that many bf16 rows (avx512_bf16)
  if (const char* err = qk->int_linear(a)) {
    printf("  FAIL n=%d k=%d: %s\n", c.n, c.k, err);
    ++failures;
    return;
  }
  double max_err = 0, max_ref = 0;
  for (int i = 0; i < c.m; ++i)
    for (int n = 0; n < c.n; ++n) {
      double ref = 0;
      for (int k = 0; k < c.k; ++k) {
        const int g = k / c.group;
        ref += (double)x[(size_t)i * c.k + k] * ((double)q[(size_t)n * c.k + k] - z[(size_t)n * G + g]) * s[(size_t)n * G + g];
      }
      const double got = bf ? bf16_bits_to_f32(ob[(size_t)i * c.n + n]) : of[(size_t)i * c.n + n];
      max_err = fmax(max_err, fabs(got - ref));
      max_ref = fmax(max_ref, fabs(ref));
    }
  const double rel = max_err / (max_ref > 1e-6 ? max_ref : 1e-6);
  const double tol = bf ? 8e-3 : 1e-5;
  if (!(rel < tol)) {
    printf("  FAIL %s n=%d k=%d group=%d bits=%d m=%d %s dp_min_rows=%d: relative error %.2e\n", qk->isa, c.n,
           c.k, c.group, c.bits, c.m, c.sym ? "sym" : "asym", c.dp_min_rows, rel);
    ++failures;
  }
}

static void test_variant(const QuantKernels* qk) {
  const int shapes[][3] = {{100, 224, 32}, {70, 320, 64}, {45, 384, 128}, {33, 201, 201}, {161, 576, 576}};
  const int ms[] = {1, 2, 3, 5, 8, 9, 17, 33};
  int cases = 0;
  for (const auto& sh : shapes)
    for (int bits : {8, 4})
      for (bool sym : {true, false})
        for (int m : ms)
          for (int dt : {(int)octavo::kFloat32, (int)octavo::kBFloat16})
            for (int dp : {0, 2}) {  // bf16 from 2 rows: the VDPBF16PS kernel where the build has it
              if (dp && dt != octavo::kBFloat16) continue;
              run_case(qk, Case{sh[0], sh[1], sh[2], bits, m, sym, dt, dp});
              ++cases;
            }
  printf("  %d cases\n", cases);
}

int main(int argc, char** argv) {
  octavo::threading::set_openmp((void*)&GOMP_parallel, (void*)&omp_get_thread_num,
                                (void*)&omp_get_max_threads);
  std::string expect;
  for (int i = 1; i < argc; ++i)
    if (!strcmp(argv[i], "--expect-isa") && i + 1 < argc) expect = argv[++i];
  const octavo::CpuFeatures f = octavo::detect_cpu_features();
  const char* best = octavo::best_isa(f);
  printf("dispatcher picks: %s\n", best);
  if (!expect.empty() && expect != best) {
    printf("FAIL: expected the dispatcher to pick %s\n", expect.c_str());
    return 1;
  }
  for (const Variant& v : all_variants()) {
    if (!runs_here(v.name, f)) {
      printf("[%s] skipped: this CPU cannot run it\n", v.name);
      continue;
    }
    printf("[%s]%s\n", v.name, !strcmp(v.name, best) ? " (dispatched)" : "");
    test_variant(v.get());
  }
  if (failures) {
    printf("%d FAILURES\n", failures);
    return 1;
  }
  printf("all passed\n");
  return 0;
}
