// pybind11 functions of the weight-only INT8 / INT4 linear kernels (layout: quant_api.h),
// registered into each variant's module by bindings.cpp. Same boundary rules as tensor_args.h:
// every tensor is checked (dtype, rank, shape against n / k / group / bits, contiguity) before
// its pointer reaches a kernel; a violation is a ValueError naming the function and the tensor.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "quant_api.h"
#include "tensor_args.h"

namespace octavo {
namespace OCTAVO_ISA_NS {
const QuantKernels* quant_kernels();
}

namespace bind {

inline bool is_uint8(py::handle t) {
  // Never destroyed: the object must not be released after the interpreter shuts down.
  static const py::object* u8 = new py::object(py::module_::import("torch").attr("uint8"));
  return py::getattr(t, "dtype").is(*u8);
}

// The packed weight, scales and zeros of (n, k, group, bits), checked against each other.
inline IntWeights int_weights(const char* fn, py::handle weight, py::handle scales, py::handle zeros,
                              int n, int k, int group, int bits) {
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
  return IntWeights{w.data<uint8_t>(), s.data<float>(), z.data<float>(), n, k, group, bits};
}

inline IntLinearArgs int_linear_args(py::handle x, py::handle weight, py::handle scales, py::handle zeros,
                                     py::handle out, int n, int k, int group, int bits, py::handle bias,
                                     int num_threads, bool allow_amx) {
  const char* fn = "int_linear";
  IntLinearArgs a{};
  a.w = int_weights(fn, weight, scales, zeros, n, k, group, bits);
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

// bindings.cpp includes this after its run_checked (GIL released; a refusal is a ValueError).
inline void register_quant(py::module_& m) {
  static const octavo::QuantKernels* qk = octavo::OCTAVO_ISA_NS::quant_kernels();
  m.def("int_linear",
        [](py::handle x, py::handle weight, py::handle scales, py::handle zeros, py::handle out, int n, int k,
           int group, int bits, py::handle bias, int num_threads, bool allow_amx) {
          const octavo::IntLinearArgs a = octavo::bind::int_linear_args(x, weight, scales, zeros, out, n, k, group,
                                                                        bits, bias, num_threads, allow_amx);
          run_checked("int_linear", qk->int_linear, a);
        },
        py::arg("x"), py::arg("weight"), py::arg("scales"), py::arg("zeros"), py::arg("out"),
        py::arg("n"), py::arg("k"), py::arg("group"), py::arg("bits"), py::arg("bias") = py::none(),
        py::arg("num_threads") = 0, py::arg("allow_amx") = true,
        "out [M, n] = x [M, k] @ dequant(weight).T (+ bias) for packed INT8 / INT4 weights (quant_api.h); "
        "bf16 batches of >= 5 rows run on AMX where int_amx() (allow_amx=False: never).");
  m.def("int_amx", [] { return qk->int_amx(); },
        "Whether int_linear runs bf16 batches of >= 5 rows on AMX on this CPU (any number of rows).");
  m.def("int_linear_a8",
        [](py::handle x, py::handle weight, py::handle scales, py::handle zeros, py::handle out, int n, int k,
           int group, int bits, py::handle bias, float input_scale, int num_threads, bool allow_amx) {
          octavo::IntLinearArgs a = octavo::bind::int_linear_args(x, weight, scales, zeros, out, n, k, group,
                                                                  bits, bias, num_threads, allow_amx);
          a.input_scale = input_scale;
          run_checked("int_linear_a8", qk->int_linear_a8, a);
        },
        py::arg("x"), py::arg("weight"), py::arg("scales"), py::arg("zeros"), py::arg("out"),
        py::arg("n"), py::arg("k"), py::arg("group"), py::arg("bits"), py::arg("bias") = py::none(),
        py::arg("input_scale") = 0.f, py::arg("num_threads") = 0, py::arg("allow_amx") = true,
        "out [M, n] = like int_linear, but x is first quantized to int8 per row (input_scale > 0: that "
        "static scale; else amax / 127.5) and the codes meet the weights in integer dot products "
        "(AVX512-VNNI; W8A8 / W4A8 numerics, csrc/cpu/quant_a8.h); bf16 batches of > 8 rows feed the "
        "codes to the AMX kernel where int_amx() (allow_amx=False: never).");
  m.def("int_a8", [] { return qk->int_a8(); },
        "Whether int_linear_a8 runs on this CPU (AVX-512 build, AVX512-VNNI and AVX512-VBMI).");
  m.def("int_dequant",
        [](py::handle weight, py::handle scales, py::handle zeros, py::handle out, int n, int k, int group,
           int bits, int num_threads) {
          const octavo::IntDequantArgs a =
              octavo::bind::int_dequant_args(weight, scales, zeros, out, n, k, group, bits, num_threads);
          run_checked("int_dequant", qk->int_dequant, a);
        },
        py::kw_only(), py::arg("weight"), py::arg("scales"), py::arg("zeros"), py::arg("out"), py::arg("n"),
        py::arg("k"), py::arg("group"), py::arg("bits"), py::arg("num_threads") = 0,
        "out [k, n] = the dequantized weights of packed INT8 / INT4 weights, transposed, in out's dtype.");
}
