// bf16 GEMV / skinny GEMM for decode: out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]).
//
// The weight is packed once (octavo/models/cpu_gemv.py) as [N / 16][K / 2][16][2]: for each
// block of 16 output rows, K / 2 vectors of 16 lanes, lane i holding (W[n, 2p], W[n, 2p + 1]),
// so one 64-byte load feeds one VDPBF16PS (or its AVX-512 / AVX2 / NEON / scalar emulation)
// against a broadcast pair of x, and the weight streams through memory exactly once per call,
// read sequentially. Accumulation is fp32; the result is rounded to bf16 once, bias added
// first (like oneDNN). Built per ISA like kernels.cpp.
#pragma once

#include <stdint.h>

namespace octavo {

struct GemvArgs {
  const uint16_t* x; int64_t x_stride;  // [m, k] bf16, rows x_stride elements apart
  const uint16_t* w;                    // packed [n / 16, k / 2, 16, 2] bf16
  const uint16_t* bias;                 // [n] bf16 or nullptr
  uint16_t* out; int64_t o_stride;      // [m, n] bf16
  int64_t m, n, k;                      // n % 16 == 0, k % 2 == 0 (checked by the binding)
  int num_threads;                      // 0: torch's intra-op pool size
};

}  // namespace octavo
