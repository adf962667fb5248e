// octavo CPU kernels: weight-only INT8 / INT4 linear layers (the ISA-independent interface).
//
// Canonical weights (what every checkpoint loader produces): codes q[n, k] (uint8, 0..255 or
// 0..15), scales s[n, g] and zero points z[n, g] per group of `group` consecutive k,
//   w[n, k] = (q[n, k] - z[n, k / group]) * s[n, k / group].
// The kernels stream a layout the Python side builds ONCE at load
// (octavo/quantization/kernels/cpu_int.py):
//   N is split into tiles of kQuantTile = 32 output channels (the last tile zero-padded);
//   weight  uint8 [n_tiles][k_rows][32]: 8-bit: k_rows = K, byte j of row k = q[tile*32 + j, k];
//           4-bit: k_rows = ceil(K / 2), byte j of row r = q[., 2r] | q[., 2r + 1] << 4
//           (a missing odd column is code 0); so one tile's weights are one contiguous stretch
//           read front to back, a 32-byte row per k (8-bit) or per pair of k (4-bit);
//   scales  float32 [n_tiles][G][32] and zeros float32 [n_tiles][G][32] (z as a float), G = K / group.
// y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) accumulated in fp32, rounded once to x's dtype.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace octavo {

constexpr int kQuantTile = 32;  // output channels per weight tile

struct IntWeights {
  const uint8_t* weight;  // [n_tiles][k_rows][32]
  const float* scales;    // [n_tiles][G][32]
  const float* zeros;     // [n_tiles][G][32]
  int n;                  // output channels (unpadded)
  int k;                  // input features
  int group;              // k per scale group; K % group == 0 (4-bit: group even, or group == K)
  int bits;               // 8 or 4
  // >= 0: every entry of zeros is this value (a symmetric checkpoint's midpoint), so the batch-1
  // and int8-activation kernels use it instead of streaming zeros (a quarter of a 4-bit g32
  // weight's bytes); < 0: read zeros
  float zero_point = -1.f;
};

struct IntLinearArgs {
  IntWeights w;
  const void* x; int64_t x_stride;  // [m, k] in `dtype`, unit inner stride
  void* out; int64_t o_stride;      // [m, n] in `dtype`, unit inner stride
  const float* bias;                // [n] or null
  int64_t m;
  int dtype;        // DType of x and out
  int num_threads;  // 0: the OpenMP runtime's current default
  int allow_amx;    // 0: never the AMX path (comparisons); else where int_amx() and the shape allow
  float input_scale;  // int_linear_a8 only: > 0 a static activation scale, else per-row dynamic
  // > 0: bf16 batches of at least this many rows take the VDPBF16PS kernel (quant_dpbf16.h) in
  // the avx512_bf16 build where the AMX path does not apply; 0: never (other builds ignore it)
  int dp_min_rows;
};

// out[k, n] = w[n, k] in `dtype` (the transposed weight, rows of o_stride >= n elements): the
// large-batch path dequantizes blocks of tiles into cache and hands each matmul to the BLAS.
struct IntDequantArgs {
  IntWeights w;
  void* out; int64_t o_stride;
  int dtype;
  int num_threads;
};

struct QuantKernels {
  const char* isa;
  // nullptr on success, else why nothing was computed
  const char* (*int_linear)(const IntLinearArgs&);
  const char* (*int_dequant)(const IntDequantArgs&);
  // whether int_linear runs bf16 batches of >= 5 rows with AMX on this CPU
  bool (*int_amx)();
  // W8A8 / W4A8 (quant_a8.h): x quantized per row to int8, integer dot products; nullptr on
  // success, else why not (no VNNI here, an unsupported shape)
  const char* (*int_linear_a8)(const IntLinearArgs&);
  bool (*int_a8)();  // whether int_linear_a8 runs here
  // whether int_linear has the VDPBF16PS kernel for bf16 batches (IntLinearArgs::dp_min_rows)
  bool (*int_dpbf16)();
};

}  // namespace octavo
