// Checked arguments of the bf16 GEMV (gemv.h), in the style of tensor_args.h.
#pragma once

#include "gemv.h"
#include "tensor_args.h"

namespace octavo {
namespace bind {

inline GemvArgs gemv_args(py::handle x, py::handle weight, py::handle out, py::handle bias, int num_threads) {
  const char* fn = "gemv";
  const View xv = rows_view(fn, "x", x);
  const View w = view(fn, "weight", weight, 4);
  const View o = rows_view(fn, "out", out);
  require(xv.dtype == kBF16, fn, xv, "must be bfloat16");
  same_dtype(fn, xv, w);
  same_dtype(fn, xv, o);
  require(w.contiguous() && w.size[2] == 16 && w.size[3] == 2, fn, w,
          "must be the packed layout, contiguous [n / 16, k / 2, 16, 2]");
  require(w.size[1] * 2 == xv.size[1], fn, w, "does not match x " + xv.shape() + " (k / 2 pairs)");
  require(o.size[0] == xv.size[0] && o.size[1] == w.size[0] * 16, fn, o,
          "must be [m, n] for x " + xv.shape() + " and weight " + w.shape());
  GemvArgs a{};
  if (!bias.is_none()) {
    const View b = view(fn, "bias", bias, 1);
    same_dtype(fn, xv, b);
    require(b.size[0] == o.size[1] && (b.stride[0] == 1 || b.size[0] == 1), fn, b, "must be contiguous [n]");
    a.bias = b.data<uint16_t>();
  }
  a.x = xv.data<uint16_t>();
  a.x_stride = xv.stride[0];
  a.w = w.data<uint16_t>();
  a.out = reinterpret_cast<uint16_t*>(o.ptr);
  a.o_stride = o.stride[0];
  a.m = xv.size[0];
  a.n = o.size[1];
  a.k = xv.size[1];
  a.num_threads = num_threads;
  return a;
}

}  // namespace bind
}  // namespace octavo
