// pybind11 functions of the weight-only INT8 / INT4 linear kernels (layout: quant_api.h),
// registered into each variant's module by bindings.cpp; their arguments are checked by
// quant_args.h before any pointer reaches a kernel.
#pragma once

#include <pybind11/pybind11.h>

#include "quant_args.h"

// octavo::OCTAVO_ISA_NS::quant_kernels() is declared by bindings.cpp (quant_kernels.cpp).

// bindings.cpp includes this after its run_checked (GIL released; a refusal is a ValueError).
inline void register_quant(py::module_& m) {
  static const octavo::QuantKernels* qk = octavo::OCTAVO_ISA_NS::quant_kernels();
  m.def("int_linear",
        [](py::handle x, py::handle weight, py::handle scales, py::handle zeros, py::handle out, int n, int k,
           int group, int bits, py::handle bias, int num_threads, bool allow_amx, float zero_point,
           int dp_min_rows) {
          octavo::IntLinearArgs a = octavo::bind::int_linear_args(
              x, weight, scales, zeros, out, n, k, group, bits, bias, num_threads, allow_amx, zero_point);
          if (dp_min_rows < 0) octavo::bind::fail("int_linear", "dp_min_rows must be >= 0");
          a.dp_min_rows = dp_min_rows;
          run_checked("int_linear", qk->int_linear, a);
        },
        py::arg("x"), py::arg("weight"), py::arg("scales"), py::arg("zeros"), py::arg("out"),
        py::arg("n"), py::arg("k"), py::arg("group"), py::arg("bits"), py::arg("bias") = py::none(),
        py::arg("num_threads") = 0, py::arg("allow_amx") = true, py::arg("zero_point") = -1.f,
        py::arg("dp_min_rows") = 0,
        "out [M, n] = x [M, k] @ dequant(weight).T (+ bias) for packed INT8 / INT4 weights (quant_api.h); "
        "bf16 batches of >= 5 rows run on AMX where int_amx() (allow_amx=False: never); zero_point >= 0: "
        "every entry of zeros is that value (batch 1 then does not read zeros); dp_min_rows > 0: other bf16 "
        "batches of at least that many rows run on VDPBF16PS where int_dpbf16() (0: never).");
  m.def("int_amx", [] { return qk->int_amx(); },
        "Whether int_linear runs bf16 batches of >= 5 rows on AMX on this CPU (any number of rows).");
  m.def("int_dpbf16", [] { return qk->int_dpbf16(); },
        "Whether int_linear has the VDPBF16PS kernel for bf16 batches (the avx512_bf16 build).");
  m.def("int_linear_a8",
        [](py::handle x, py::handle weight, py::handle scales, py::handle zeros, py::handle out, int n, int k,
           int group, int bits, py::handle bias, float input_scale, int num_threads, bool allow_amx,
           float zero_point) {
          octavo::IntLinearArgs a = octavo::bind::int_linear_args(x, weight, scales, zeros, out, n, k, group,
                                                                  bits, bias, num_threads, allow_amx, zero_point);
          a.input_scale = input_scale;
          run_checked("int_linear_a8", qk->int_linear_a8, a);
        },
        py::arg("x"), py::arg("weight"), py::arg("scales"), py::arg("zeros"), py::arg("out"),
        py::arg("n"), py::arg("k"), py::arg("group"), py::arg("bits"), py::arg("bias") = py::none(),
        py::arg("input_scale") = 0.f, py::arg("num_threads") = 0, py::arg("allow_amx") = true,
        py::arg("zero_point") = -1.f,
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
