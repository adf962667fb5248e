// What the CPU running this process supports, asked of the CPU itself (CPUID on x86, the
// kernel's HWCAP on AArch64) -- so an emulator's CPU model (qemu -cpu Haswell) is honoured.
// Compiled without ISA flags.
#pragma once

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace octavo {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512bf16 = false;
  bool neon = false, asimdhp = false, arm_bf16 = false;
};

static inline CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XGETBV).
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#elif defined(__aarch64__)
  f.neon = true;  // ASIMD is mandatory on AArch64
#if defined(__linux__)
  unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.asimdhp = (hw & (1UL << 10)) != 0;     // HWCAP_ASIMDHP
  f.arm_bf16 = (hw2 & (1UL << 14)) != 0;   // HWCAP2_BF16
#endif
#endif
  return f;
}

// The best variant this CPU can run among those built into the binary.
static inline const char* best_isa(const CpuFeatures& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c)
    return f.avx512bf16 ? "avx512_bf16" : "avx512";
  if (f.avx2 && f.fma && f.f16c) return "avx2";
  if (f.neon) return "neon";
  return "scalar";
}

}  // namespace octavo
