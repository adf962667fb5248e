// pybind11 module for one ISA variant (octavo._C_<isa>). Kernels take data pointers and sizes
// as integers: octavo/attention/backends/cpu_paged.py and octavo/models/cpu_fused_ops.py
// validate dtypes, shapes and strides first. Every kernel call releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "api.h"
#include "cpu_features.h"

namespace octavo {
namespace OCTAVO_ISA_NS {
const Kernels* kernels();
}
}  // namespace octavo

namespace py = pybind11;
using octavo::Kernels;

static const Kernels* kern() {
  static const Kernels* k = octavo::OCTAVO_ISA_NS::kernels();
  return k;
}

template <class T>
static T* ptr(int64_t p) {
  return reinterpret_cast<T*>(static_cast<intptr_t>(p));
}

// Runs a kernel that checks its own arguments (it returns nullptr, or why it computed nothing)
// with the GIL released; a refusal becomes ValueError("<name>: <why>").
template <class Args>
static void run_checked(const char* name, const char* (*kernel)(const Args&), const Args& a) {
  const char* err;
  {
    py::gil_scoped_release nogil;
    err = kernel(a);
  }
  if (err) throw py::value_error(std::string(name) + ": " + err);
}

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
        [](int64_t query, int64_t q_stride, int64_t out, int64_t o_stride, int64_t kv_cache,
           int64_t query_start_loc, int64_t seq_lens, int64_t block_table, int64_t bt_stride,
           int num_reqs, int num_heads, int num_kv_heads, int head_size, int block_size,
           float scale, int dtype, int k_layout, int num_threads, int sliding_window, float soft_cap) {
          octavo::PagedAttentionArgs a;
          a.query = ptr<const void>(query);
          a.q_stride = q_stride;
          a.out = ptr<void>(out);
          a.o_stride = o_stride;
          a.kv_cache = ptr<const void>(kv_cache);
          a.query_start_loc = ptr<const int32_t>(query_start_loc);
          a.seq_lens = ptr<const int32_t>(seq_lens);
          a.block_table = ptr<const int32_t>(block_table);
          a.bt_stride = bt_stride;
          a.num_reqs = num_reqs;
          a.num_heads = num_heads;
          a.num_kv_heads = num_kv_heads;
          a.head_size = head_size;
          a.block_size = block_size;
          a.scale = scale;
          a.dtype = dtype;
          a.k_layout = k_layout;
          a.num_threads = num_threads;
          a.sliding_window = sliding_window;
          a.soft_cap = soft_cap;
          run_checked("paged_attention", kern()->paged_attention, a);
        },
        py::arg("query"), py::arg("q_stride"), py::arg("out"), py::arg("o_stride"), py::arg("kv_cache"),
        py::arg("query_start_loc"), py::arg("seq_lens"), py::arg("block_table"), py::arg("bt_stride"),
        py::arg("num_reqs"), py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_size"),
        py::arg("block_size"), py::arg("scale"), py::arg("dtype"), py::arg("k_layout"),
        py::arg("num_threads"), py::arg("sliding_window") = 0, py::arg("soft_cap") = 0.f);

  m.def("write_kv",
        [](int64_t key, int64_t k_stride_tok, int64_t k_stride_head, int64_t value,
           int64_t v_stride_tok, int64_t v_stride_head, int64_t kv_cache, int64_t slot_mapping,
           int num_tokens, int num_kv_heads, int head_size, int block_size, int dtype,
           int k_layout, int num_threads) {
          octavo::WriteKVArgs a;
          a.key = ptr<const void>(key);
          a.k_stride_tok = k_stride_tok;
          a.k_stride_head = k_stride_head;
          a.value = ptr<const void>(value);
          a.v_stride_tok = v_stride_tok;
          a.v_stride_head = v_stride_head;
          a.kv_cache = ptr<void>(kv_cache);
          a.slot_mapping = ptr<const int64_t>(slot_mapping);
          a.num_tokens = num_tokens;
          a.num_kv_heads = num_kv_heads;
          a.head_size = head_size;
          a.block_size = block_size;
          a.dtype = dtype;
          a.k_layout = k_layout;
          a.num_threads = num_threads;
          run_checked("write_kv", kern()->write_kv, a);
        });

  m.def("rms_norm",
        [](int64_t x, int64_t x_stride, int64_t residual, int64_t r_stride, int64_t weight,
           int64_t out, int64_t o_stride, int64_t residual_out, int64_t ro_stride, int64_t rows,
           int n, float eps, int dtype, int num_threads) {
          octavo::RMSNormArgs a;
          a.x = ptr<const void>(x);
          a.x_stride = x_stride;
          a.residual = ptr<const void>(residual);
          a.r_stride = r_stride;
          a.weight = ptr<const void>(weight);
          a.out = ptr<void>(out);
          a.o_stride = o_stride;
          a.residual_out = ptr<void>(residual_out);
          a.ro_stride = ro_stride;
          a.rows = rows;
          a.n = n;
          a.eps = eps;
          a.dtype = dtype;
          a.num_threads = num_threads;
          kern()->rms_norm(a);
        },
        py::call_guard<py::gil_scoped_release>());

  m.def("silu_and_mul",
        [](int64_t x, int64_t x_stride, int64_t out, int64_t o_stride, int64_t rows, int n,
           int dtype, int num_threads) {
          octavo::SiluMulArgs a;
          a.x = ptr<const void>(x);
          a.x_stride = x_stride;
          a.out = ptr<void>(out);
          a.o_stride = o_stride;
          a.rows = rows;
          a.n = n;
          a.dtype = dtype;
          a.num_threads = num_threads;
          kern()->silu_and_mul(a);
        },
        py::call_guard<py::gil_scoped_release>());

  m.def("rope",
        [](int64_t q, int64_t q_stride_tok, int64_t q_stride_head, int64_t k,
           int64_t k_stride_tok, int64_t k_stride_head, int64_t q_out, int64_t k_out,
           int64_t positions, int64_t cos, int64_t sin, int64_t num_tokens, int num_q_heads,
           int num_k_heads, int head_size, int dtype, int num_threads) {
          octavo::RopeArgs a;
          a.q = ptr<const void>(q);
          a.q_stride_tok = q_stride_tok;
          a.q_stride_head = q_stride_head;
          a.k = ptr<const void>(k);
          a.k_stride_tok = k_stride_tok;
          a.k_stride_head = k_stride_head;
          a.q_out = ptr<void>(q_out);
          a.k_out = ptr<void>(k_out);
          a.positions = ptr<const int64_t>(positions);
          a.cos = ptr<const void>(cos);
          a.sin = ptr<const void>(sin);
          a.num_tokens = num_tokens;
          a.num_q_heads = num_q_heads;
          a.num_k_heads = num_k_heads;
          a.head_size = head_size;
          a.dtype = dtype;
          a.num_threads = num_threads;
          kern()->rope(a);
        },
        py::call_guard<py::gil_scoped_release>());
}
