// pybind11 module for one ISA variant (octavo._C_<isa>). Kernels take torch tensors by keyword;
// this file reads their data pointer, dtype, shape and strides through Python (no libtorch
// linkage), checks them once per call against what the kernel reads -- dtypes, ranks, shapes
// that must agree, unit inner strides, and index tensors' values (slots, positions, block ids,
// query offsets) inside the buffers they index -- and only then fills the kernel's argument
// struct. A bad argument is a ValueError naming the function and the tensor; no kernel ever
// sees an unchecked pointer. Every kernel call releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "api.h"
#include "cpu_features.h"
#include "quant_api.h"

namespace octavo {
namespace OCTAVO_ISA_NS {
const Kernels* kernels();
const QuantKernels* quant_kernels();  // quant_kernels.cpp
}
}  // namespace octavo

namespace py = pybind11;
using octavo::Kernels;

static const Kernels* kern() {
  static const Kernels* k = octavo::OCTAVO_ISA_NS::kernels();
  return k;
}

#include "tensor_args.h"
#include "gemv_args.h"
#include "layer_step.h"

namespace octavo {
namespace OCTAVO_ISA_NS {
void gemv_bf16(const GemvArgs& a);  // gemv.cpp
bool gemv_amx_supported();          // gemv.cpp
}
}  // namespace octavo

// Runs a kernel that checks its own arguments (it returns nullptr, or why it computed nothing)
// with the GIL released; a refusal becomes ValueError("<name>: <why>"), an allocation that
// failed inside the kernel MemoryError.
template <class Args>
static void run_checked(const char* name, const char* (*kernel)(const Args&), const Args& a) {
  const char* err;
  {
    py::gil_scoped_release nogil;
    err = kernel(a);
  }
  if (err == nullptr) return;
  const std::string msg = std::string(name) + ": " + err;
  if (std::string(err).rfind("out of memory", 0) == 0) {
    PyErr_SetString(PyExc_MemoryError, msg.c_str());
    throw py::error_already_set();
  }
  throw py::value_error(msg);
}

// One linear of a layer step: the kernel the per-op path calls for it (layer_step.h); nullptr
// or why it computed nothing.
static const char* run_linear(const octavo::bind::LinearCall& c) {
  static const octavo::QuantKernels* qk = octavo::OCTAVO_ISA_NS::quant_kernels();
  switch (c.kind) {
    case octavo::bind::kLinearGemv: octavo::OCTAVO_ISA_NS::gemv_bf16(c.gemv); return nullptr;
    case octavo::bind::kLinearInt: return qk->int_linear(c.q);
    default: return qk->int_linear_a8(c.q);
  }
}

// The kernels of one decoder-layer step (layer_step.h) in their order; nullptr or why a kernel
// computed nothing (then nothing after it ran).
static const char* run_layer_step(const octavo::bind::LayerStep& st) {
  const Kernels* k = kern();
  k->rms_norm(st.norm1);
  if (const char* err = run_linear(st.qkv)) return err;
  k->rope(st.rope);
  if (st.attn_rows > st.written)
    memset(st.attn_out + st.written * st.attn_row_elems, 0,
           (size_t)(st.attn_rows - st.written) * st.attn_row_elems * sizeof(uint16_t));
  if (const char* err = k->paged_attention(st.attn)) return err;
  if (const char* err = run_linear(st.o)) return err;
  k->rms_norm(st.norm2);
  if (const char* err = run_linear(st.gate_up)) return err;
  k->silu_and_mul(st.silu);
  return run_linear(st.down);
}

static const char* run_layer_steps(const std::vector<octavo::bind::LayerStep>& steps) {
  for (const octavo::bind::LayerStep& st : steps)
    if (const char* err = run_layer_step(st)) return err;
  return nullptr;
}

template <class Args>
static void run_unchecked(void (*kernel)(const Args&), const Args& a) {
  py::gil_scoped_release nogil;
  kernel(a);
}

#include "quant_bindings.h"

PYBIND11_MODULE(OCTAVO_MODULE_NAME, m) {
  m.doc() = "octavo CPU kernels (one ISA variant)";
  m.attr("ISA") = kern()->isa;
  m.attr("BF16_DOT") = kern()->bf16_dot;

  m.def("cpu_features", []() {
    octavo::CpuFeatures f = octavo::detect_cpu_features();
    py::dict d;
    d["avx2"] = f.avx2; d["fma"] = f.fma; d["f16c"] = f.f16c;
    d["avx512f"] = f.avx512f; d["avx512bw"] = f.avx512bw; d["avx512vl"] = f.avx512vl;
    d["avx512dq"] = f.avx512dq; d["avx512_bf16"] = f.avx512bf16;
    d["neon"] = f.neon; d["asimdhp"] = f.asimdhp; d["arm_bf16"] = f.arm_bf16;
    d["best"] = octavo::best_isa(f);
    return d;
  });
  m.def("init_openmp", [](const std::string& path) {
    char err[512] = {0};
    bool ok = octavo::threading::init_openmp_from_library(path.c_str(), err, sizeof(err));
    return ok ? std::string() : std::string(err);
  }, "Use the already loaded OpenMP runtime at `path`; returns '' or the reason it failed.");
  m.def("have_openmp", &octavo::threading::have_openmp);
  m.def("resolve_threads", &octavo::threading::resolve_threads);
  m.def("bind_threads", [](const std::vector<int>& cpus, bool pin_caller) {
    return octavo::threading::bind_threads(cpus.data(), (int)cpus.size(), pin_caller);
  }, py::arg("cpus"), py::arg("pin_caller") = false,
  "Pin OpenMP thread i to cpus[i] (thread 0, the caller, only with pin_caller); returns how many were pinned.");

  m.def("paged_attention",
        [](py::handle query, py::handle out, py::handle kv_cache, py::handle query_start_loc,
           py::handle seq_lens, py::handle block_table, float scale, int sliding_window,
           float soft_cap, int num_threads, bool allow_amx, py::handle key, py::handle value,
           py::handle slot_mapping) {
          octavo::PagedAttentionArgs a = octavo::bind::paged_attention_args(
              query, out, kv_cache, query_start_loc, seq_lens, block_table, scale, sliding_window,
              soft_cap, num_threads);
          a.allow_amx = allow_amx ? 1 : 0;
          octavo::WriteKVArgs w{};
          if (!key.is_none() || !value.is_none() || !slot_mapping.is_none()) {
            w = octavo::bind::write_kv_args(key, value, kv_cache, slot_mapping, num_threads);
            a.write = &w;
          }
          run_checked("paged_attention", kern()->paged_attention, a);
        },
        py::kw_only(), py::arg("query"), py::arg("out"), py::arg("kv_cache"),
        py::arg("query_start_loc"), py::arg("seq_lens"), py::arg("block_table"), py::arg("scale"),
        py::arg("sliding_window") = 0, py::arg("soft_cap") = 0.f, py::arg("num_threads") = 0,
        py::arg("allow_amx") = true, py::arg("key") = py::none(), py::arg("value") = py::none(),
        py::arg("slot_mapping") = py::none(),
        "Causal attention of query [T, H, D] over the paged cache into out [T, H, D] (sliding_window "
        "> 0: each query sees its last sliding_window keys; soft_cap > 0: capped scores; bf16 runs "
        "on AMX tiles where attention_amx(), allow_amx=False: never). With key, value and "
        "slot_mapping it first writes them as write_kv does (a decode token's inside its work item).");
  m.def("attention_amx", [] { return kern()->attention_amx(); },
        "Whether bf16 paged attention runs its products on AMX tiles here (variant and CPU).");

  m.def("write_kv",
        [](py::handle key, py::handle value, py::handle kv_cache, py::handle slot_mapping,
           int num_threads) {
          const octavo::WriteKVArgs a =
              octavo::bind::write_kv_args(key, value, kv_cache, slot_mapping, num_threads);
          run_checked("write_kv", kern()->write_kv, a);
        },
        py::kw_only(), py::arg("key"), py::arg("value"), py::arg("kv_cache"),
        py::arg("slot_mapping"), py::arg("num_threads") = 0,
        "Write key/value [N, Hk, D] (N = len(slot_mapping)) into the cache at the slots (< 0: skip).");

  m.def("rms_norm",
        [](py::handle x, py::handle weight, py::handle out, float eps, py::handle residual,
           py::handle residual_out, int num_threads) {
          run_unchecked(kern()->rms_norm, octavo::bind::rms_norm_args(x, weight, out, eps, residual,
                                                                       residual_out, num_threads));
        },
        py::kw_only(), py::arg("x"), py::arg("weight"), py::arg("out"), py::arg("eps"),
        py::arg("residual") = py::none(), py::arg("residual_out") = py::none(),
        py::arg("num_threads") = 0,
        "out = norm(x [+ residual]) for x [rows, n]; residual_out = x + residual.");

  m.def("silu_and_mul",
        [](py::handle x, py::handle out, int num_threads) {
          run_unchecked(kern()->silu_and_mul, octavo::bind::silu_and_mul_args(x, out, num_threads));
        },
        py::kw_only(), py::arg("x"), py::arg("out"), py::arg("num_threads") = 0,
        "out [rows, n] = silu(x[:, :n]) * x[:, n:] for x [rows, 2n].");

  m.def("rope",
        [](py::handle positions, py::handle q, py::handle k, py::handle cos, py::handle sin,
           py::handle q_out, py::handle k_out, int num_threads) {
          run_unchecked(kern()->rope, octavo::bind::rope_args(positions, q, k, cos, sin, q_out, k_out,
                                                               num_threads));
        },
        py::kw_only(), py::arg("positions"), py::arg("q"), py::arg("k"), py::arg("cos"),
        py::arg("sin"), py::arg("q_out"), py::arg("k_out"), py::arg("num_threads") = 0,
        "Neox RoPE of q [T, H, D] and k [T, Hk, D] into contiguous q_out, k_out.");

  m.def("decoder_layer",
        [](py::handle hidden, py::handle residual, py::handle hidden_out, py::handle residual_out,
           py::handle norm1, py::handle norm2, float eps1, float eps2, py::handle qkv_weight,
           py::handle qkv_bias, py::handle o_weight, py::handle o_bias, py::handle gate_up_weight,
           py::handle gate_up_bias, py::handle down_weight, py::handle down_bias, py::handle positions,
           py::handle cos, py::handle sin, int num_heads, int num_kv_heads, py::handle kv_cache,
           py::handle slot_mapping, py::handle query_start_loc, py::handle seq_lens, py::handle block_table,
           float scale, int sliding_window, float soft_cap, int num_threads) {
          namespace b = octavo::bind;
          const char* fn = "decoder_layer";
          const b::View h = b::hidden_view(fn, "hidden", hidden, -1, 0);
          const b::LayerConsts c{norm1, norm2, eps1, eps2, qkv_weight, qkv_bias, o_weight, o_bias, gate_up_weight,
                                 gate_up_bias, down_weight, down_bias, cos, sin, kv_cache, scale, sliding_window,
                                 soft_cap};
          const b::LayerPlan p = b::layer_plan(fn, c, h.size[1], num_heads, num_kv_heads);
          const int64_t t = h.size[0];
          const b::StepIO io = b::step_io(fn, t, positions, slot_mapping, query_start_loc, seq_lens, block_table);
          b::check_step(fn, io, p);
          const b::View ho = b::hidden_view(fn, "hidden_out", hidden_out, t, h.size[1]);
          const b::View ro = b::hidden_view(fn, "residual_out", residual_out, t, h.size[1]);
          const void* r_in = residual.is_none() ? nullptr : b::hidden_view(fn, "residual", residual, t, h.size[1]).ptr;
          static thread_local std::vector<char> scratch;
          const b::ScratchLayout at(p.shape, t);
          char* base = b::scratch_base(scratch, at.bytes);
          b::LayerStep st = b::fill_layer(fn, p, at, base, io, h.ptr, r_in, ho.ptr, ro.ptr, num_threads);
          st.attn.write = &st.write;
          run_checked("decoder_layer", &run_layer_step, st);
        },
        py::kw_only(), py::arg("hidden"), py::arg("residual"), py::arg("hidden_out"), py::arg("residual_out"),
        py::arg("norm1"), py::arg("norm2"), py::arg("eps1"), py::arg("eps2"), py::arg("qkv_weight"),
        py::arg("qkv_bias"), py::arg("o_weight"), py::arg("o_bias"), py::arg("gate_up_weight"),
        py::arg("gate_up_bias"), py::arg("down_weight"), py::arg("down_bias"), py::arg("positions"),
        py::arg("cos"), py::arg("sin"), py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("kv_cache"),
        py::arg("slot_mapping"), py::arg("query_start_loc"), py::arg("seq_lens"), py::arg("block_table"),
        py::arg("scale"), py::arg("sliding_window") = 0, py::arg("soft_cap") = 0.f, py::arg("num_threads") = 0,
        "One Llama-family decoder layer step: hidden_out, residual_out = the layer of (hidden, residual) "
        "(residual None: the first layer), with the K/V of the first len(slot_mapping) tokens written; "
        "the rms_norm, linear, rope, paged_attention and silu_and_mul calls of the same arguments, in "
        "one call. A *_weight is GEMV-packed bf16 (gemv; its bias bf16) or an object with the "
        "attributes of cpu_int.PackedInt (int_linear, or int_linear_a8 where its a8 is set; its bias "
        "contiguous float32).");

  // module_local: every ISA variant is a module of its own, and a process may load several
  py::class_<octavo::bind::DecoderStack>(m, "DecoderStack", py::module_local(),
      "Every decoder layer of a model, planned once: a list of dicts with decoder_layer's layer "
      "arguments (norm1 ... soft_cap); run() is decoder_layer over all of them, layer after layer.")
      .def(py::init<py::list, int64_t, int, int>(), py::kw_only(), py::arg("layers"), py::arg("hidden_size"),
           py::arg("num_heads"), py::arg("num_kv_heads"))
      .def("__len__", [](const octavo::bind::DecoderStack& s) { return s.plans.size(); })
      .def("run",
           [](const octavo::bind::DecoderStack& s, py::handle hidden, py::handle hidden_out, py::handle residual_out,
              py::handle positions, py::handle slot_mapping, py::handle query_start_loc, py::handle seq_lens,
              py::handle block_table, int num_threads) {
             namespace b = octavo::bind;
             const char* fn = "DecoderStack.run";
             const b::View h = b::hidden_view(fn, "hidden", hidden, -1, 0);
             b::require(h.size[1] == s.dim, fn, h, "does not have the stack's hidden size");
             const int64_t t = h.size[0];
             const b::StepIO io = b::step_io(fn, t, positions, slot_mapping, query_start_loc, seq_lens, block_table);
             b::check_step(fn, io, s.plans.front());
             const b::View ho = b::hidden_view(fn, "hidden_out", hidden_out, t, s.dim);
             const b::View ro = b::hidden_view(fn, "residual_out", residual_out, t, s.dim);
             static thread_local std::vector<char> scratch;
             const b::ScratchLayout at(s.plans.front().shape, t);
             char* base = b::scratch_base(scratch, at.bytes);
             std::vector<b::LayerStep> steps(s.plans.size());
             const size_t last = steps.size() - 1;
             for (size_t i = 0; i < steps.size(); ++i) {  // layer i: pair (i - 1) % 2 -> pair i % 2
               const void* h_in = i ? base + at.pair_h[(i - 1) % 2] : h.ptr;
               const void* r_in = i ? base + at.pair_r[(i - 1) % 2] : nullptr;
               void* h_out = i == last ? ho.ptr : base + at.pair_h[i % 2];
               void* r_out = i == last ? ro.ptr : base + at.pair_r[i % 2];
               steps[i] = b::fill_layer(fn, s.plans[i], at, base, io, h_in, r_in, h_out, r_out, num_threads);
             }
             for (b::LayerStep& st : steps) st.attn.write = &st.write;
             run_checked("DecoderStack.run", &run_layer_steps, steps);
           },
           py::kw_only(), py::arg("hidden"), py::arg("hidden_out"), py::arg("residual_out"), py::arg("positions"),
           py::arg("slot_mapping"), py::arg("query_start_loc"), py::arg("seq_lens"), py::arg("block_table"),
           py::arg("num_threads") = 0,
           "hidden_out, residual_out = every layer in order over hidden (the first layer's residual is "
           "hidden), the K/V of the first len(slot_mapping) tokens written into each layer's cache.");

  m.def("row_argmax",
        [](py::handle x, py::handle out, int num_threads) {
          run_unchecked(kern()->row_argmax, octavo::bind::row_argmax_args(x, out, num_threads));
        },
        py::kw_only(), py::arg("x"), py::arg("out"), py::arg("num_threads") = 0,
        "out [rows] (int64) = the index of each row's first maximum of x [rows, n] (a NaN "
        "counts as the maximum), as torch.argmax(x, dim=-1).");

  register_quant(m);

  m.def("gemv",
        [](py::handle x, py::handle weight, py::handle out, py::handle bias, int num_threads) {
          run_unchecked(octavo::OCTAVO_ISA_NS::gemv_bf16,
                        octavo::bind::gemv_args(x, weight, out, bias, num_threads));
        },
        py::kw_only(), py::arg("x"), py::arg("weight"), py::arg("out"), py::arg("bias") = py::none(),
        py::arg("num_threads") = 0,
        "out [m, n] = x [m, k] @ W^T (+ bias), bf16, W packed [n / 16, k / 2, 16, 2] (see gemv.h); "
        "5+ rows with k % 32 == 0 run on AMX where gemv_amx() (gemv_amx.h).");
  m.def("gemv_amx", &octavo::OCTAVO_ISA_NS::gemv_amx_supported,
        "Whether gemv runs batches of 5+ rows (k % 32 == 0) on AMX tiles on this CPU.");
}
