// Checked arguments of the weight-only INT8 / INT4 linear kernels (layout: quant_api.h), in the
// style of tensor_args.h: every tensor is checked (dtype, rank, shape against n / k / group /
// bits, contiguity) before its pointer reaches a kernel; a violation is a ValueError naming the
// function and the tensor. Used by quant_bindings.h and by the fused layer step (layer_step.h).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "quant_api.h"
#include "tensor_args.h"

namespace octavo {
namespace bind {

inline bool is_uint8(py::handle t) {
  // Never destroyed: the object must not be released after the interpreter shuts down.
  static const py::object* u8 = new py::object(py::module_::import("torch").attr("uint8"));
  return py::getattr(t, "dtype").is(*u8);
}

// The packed weight, scales and zeros of (n, k, group, bits), checked against each other;
// zero_point >= 0 says every zero is that value (the caller's promise: cpu_int.prepack_int
// sets it only where it is so), < 0 nothing.
inline IntWeights int_weights(const char* fn, py::handle weight, py::handle scales, py::handle zeros,
                              int n, int k, int group, int bits, float zero_point = -1.f) {
  if (bits != 8 && bits != 4) fail(fn, "bits must be 8 or 4, got " + std::to_string(bits));
  if (n <= 0 || k <= 0 || group <= 0 || k % group)
    fail(fn, "need n, k > 0 and k a multiple of group (n=" + std::to_string(n) + ", k=" +
                 std::to_string(k) + ", group=" + std::to_string(group) + ")");
  const int64_t tiles = (n + kQuantTile - 1) / kQuantTile, rows = bits == 8 ? k : (k + 1) / 2;
  View w = view(fn, "weight", weight, 3);
  require(is_uint8(weight), fn, w, "must be uint8");
  require(w.contiguous() && w.size[0] == tiles && w.size[1] == rows && w.size[2] == kQuantTile, fn, w,
          "must be contiguous [" + std::to_string(tiles) + ", " + std::to_string(rows) + ", 32] for n=" +
              std::to_string(n) + ", k=" + std::to_string(k) + ", bits=" + std::to_string(bits));
  const View s = view(fn, "scales", scales, 3);
  const View z = view(fn, "zeros", zeros, 3);
  for (const View* v : {&s, &z})
    require(v->dtype == kF32 && v->contiguous() && v->size[0] == tiles && v->size[1] == k / group &&
                v->size[2] == kQuantTile, fn, *v,
            "must be contiguous float32 [" + std::to_string(tiles) + ", " + std::to_string(k / group) + ", 32]");
  if (zero_point >= (float)(1 << bits)) fail(fn, "zero_point must be below 2^bits");
  return IntWeights{w.data<uint8_t>(), s.data<float>(), z.data<float>(), n, k, group, bits, zero_point};
}

inline IntLinearArgs int_linear_args(py::handle x, py::handle weight, py::handle scales, py::handle zeros,
                                     py::handle out, int n, int k, int group, int bits, py::handle bias,
                                     int num_threads, bool allow_amx, float zero_point) {
  const char* fn = "int_linear";
  IntLinearArgs a{};
  a.w = int_weights(fn, weight, scales, zeros, n, k, group, bits, zero_point);
  const View xv = rows_view(fn, "x", x);
  const View o = rows_view(fn, "out", out);
  require(xv.size[1] == k, fn, xv, "must have k=" + std::to_string(k) + " columns");
  require(o.size[0] == xv.size[0] && o.size[1] == n, fn, o, "must be [" + std::to_string(xv.size[0]) + ", " +
                                                              std::to_string(n) + "] for x " + xv.shape());
  same_dtype(fn, xv, o);
  if (!bias.is_none()) {
    const View b = view(fn, "bias", bias, 1);
    require(b.dtype == kF32 && b.size[0] == n && b.stride[0] == 1, fn, b,
            "must be contiguous float32 [" + std::to_string(n) + "]");
    a.bias = b.data<float>();
  }
  a.x = xv.ptr;
  a.x_stride = xv.stride[0];
  a.out = o.ptr;
  a.o_stride = o.stride[0];
  a.m = xv.size[0];
  a.dtype = xv.dtype;
  a.num_threads = num_threads;
  a.allow_amx = allow_amx ? 1 : 0;
  return a;
}

inline IntDequantArgs int_dequant_args(py::handle weight, py::handle scales, py::handle zeros, py::handle out,
                                       int n, int k, int group, int bits, int num_threads) {
  const char* fn = "int_dequant";
  IntDequantArgs a{};
  a.w = int_weights(fn, weight, scales, zeros, n, k, group, bits);
  const View o = rows_view(fn, "out", out);
  require(o.size[0] == k && o.size[1] == n, fn, o, "must be [" + std::to_string(k) + ", " + std::to_string(n) + "] (k, n)");
  a.out = o.ptr;
  a.o_stride = o.stride[0];
  a.dtype = o.dtype;
  a.num_threads = num_threads;
  return a;
}

}  // namespace bind
}  // namespace octavo
