// The boundary between Python and the kernels: torch tensors in, checked argument structs out.
//
// A tensor is read through its Python attributes (data_ptr, dtype, shape, stride, is_cpu), so
// the extension never links against libtorch. Each *_args function checks, once per call,
// everything its kernel relies on: ranks, dtypes (one float dtype across the float tensors,
// int32/int64 for indices), shapes that must agree, the strides the kernel assumes, and the
// values of index tensors (query offsets, sequence lengths, block ids, slots, positions) against
// the buffers they index. A violation is a ValueError "<function>: <tensor> ...".
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "api.h"

namespace octavo {
namespace bind {

namespace py = pybind11;

enum Code : int { kF32 = kFloat32, kF16 = kFloat16, kBF16 = kBFloat16, kI32 = 3, kI64 = 4, kOther = -1 };

struct TorchDtypes {
  py::object f32, f16, bf16, i32, i64;
};

inline const TorchDtypes& torch_dtypes() {
  // Never destroyed: the objects must not be released after the interpreter shuts down.
  static const TorchDtypes* d = [] {
    py::module_ torch = py::module_::import("torch");
    return new TorchDtypes{torch.attr("float32"), torch.attr("float16"), torch.attr("bfloat16"),
                           torch.attr("int32"), torch.attr("int64")};
  }();
  return *d;
}

struct View {
  const char* name = "";
  char* ptr = nullptr;
  int dtype = kOther;
  int ndim = 0;
  int64_t size[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};

  std::string shape() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(size[i]);
    return s + "]";
  }
  bool contiguous() const {
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (size[i] != 1 && stride[i] != expect) return false;
      expect *= size[i];
    }
    return true;
  }
  template <class T>
  const T* data() const { return reinterpret_cast<const T*>(ptr); }
};

[[noreturn]] inline void fail(const char* fn, const std::string& what) {
  throw py::value_error(std::string(fn) + ": " + what);
}

inline void require(bool ok, const char* fn, const View& v, const std::string& what) {
  if (!ok) fail(fn, std::string(v.name) + " " + v.shape() + " " + what);
}

// Attribute names, interned once (the per-call cost is then a few dict lookups per tensor).
struct Names {
  PyObject *is_cpu, *dtype, *shape, *stride, *data_ptr;
};

inline const Names& names() {
  static const Names n = {PyUnicode_InternFromString("is_cpu"), PyUnicode_InternFromString("dtype"),
                          PyUnicode_InternFromString("shape"), PyUnicode_InternFromString("stride"),
                          PyUnicode_InternFromString("data_ptr")};
  return n;
}

// New reference to t.<name> (or t.<name>() with call), or a ValueError naming the tensor.
inline py::object get(const char* fn, const char* tensor, py::handle t, PyObject* name, bool call) {
  PyObject* r = call ? PyObject_CallMethodObjArgs(t.ptr(), name, nullptr) : PyObject_GetAttr(t.ptr(), name);
  if (r == nullptr) {
    PyErr_Clear();
    fail(fn, std::string(tensor) + " must be a torch tensor");
  }
  return py::reinterpret_steal<py::object>(r);
}

inline int64_t as_int(const char* fn, const char* tensor, PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    fail(fn, std::string(tensor) + " must be a torch tensor");
  }
  return v;
}

inline View view(const char* fn, const char* name, py::handle t, int ndim) {
  const Names& n = names();
  View v;
  v.name = name;
  if (t.is_none()) fail(fn, std::string(name) + " must be a torch tensor");
  if (get(fn, name, t, n.is_cpu, false).ptr() != Py_True) fail(fn, std::string(name) + " must be a CPU tensor");
  const py::object dt = get(fn, name, t, n.dtype, false);
  const TorchDtypes& d = torch_dtypes();
  v.dtype = dt.is(d.f32) ? kF32 : dt.is(d.f16) ? kF16 : dt.is(d.bf16) ? kBF16
          : dt.is(d.i32) ? kI32 : dt.is(d.i64) ? kI64 : kOther;
  const py::object shape = get(fn, name, t, n.shape, false);
  const py::object strides = get(fn, name, t, n.stride, true);
  if (!PyTuple_Check(shape.ptr()) || !PyTuple_Check(strides.ptr())) fail(fn, std::string(name) + " must be a torch tensor");
  const Py_ssize_t nd = PyTuple_GET_SIZE(shape.ptr());
  if (nd != ndim || PyTuple_GET_SIZE(strides.ptr()) != nd)
    fail(fn, std::string(name) + " must have " + std::to_string(ndim) + " dimensions, got " + std::to_string(nd));
  v.ndim = ndim;
  for (int i = 0; i < ndim; ++i) {
    v.size[i] = as_int(fn, name, PyTuple_GET_ITEM(shape.ptr(), i));
    v.stride[i] = as_int(fn, name, PyTuple_GET_ITEM(strides.ptr(), i));
  }
  const py::object ptr = get(fn, name, t, n.data_ptr, true);
  v.ptr = reinterpret_cast<char*>(static_cast<intptr_t>(as_int(fn, name, ptr.ptr())));
  return v;
}

inline View float_view(const char* fn, const char* name, py::handle t, int ndim) {
  View v = view(fn, name, t, ndim);
  require(v.dtype == kF32 || v.dtype == kF16 || v.dtype == kBF16, fn, v,
          "must be float32, float16 or bfloat16");
  return v;
}

inline View index_view(const char* fn, const char* name, py::handle t, int ndim, int code) {
  View v = view(fn, name, t, ndim);
  require(v.dtype == code, fn, v, code == kI32 ? "must be int32" : "must be int64");
  require(v.stride[ndim - 1] == 1 || v.size[ndim - 1] <= 1, fn, v, "must have a unit inner stride");
  if (ndim == 2) require(v.stride[0] >= v.size[1], fn, v, "rows overlap");
  return v;
}

inline void same_dtype(const char* fn, const View& a, const View& b) {
  if (a.dtype != b.dtype) fail(fn, std::string(b.name) + " must have the dtype of " + a.name);
}

inline bool heads_packed(const View& v) {  // [T, H, D] with D contiguous and heads adjacent
  return v.stride[2] == 1 && (v.stride[1] == v.size[2] || v.size[1] == 1);
}

// The paged cache [num_blocks, num_kv_heads, 2, block_size * head_size], contiguous.
struct Cache {
  View v;
  int64_t num_blocks, num_kv_heads, block_size;
};

inline Cache cache_view(const char* fn, py::handle t, int64_t head_size) {
  Cache c{float_view(fn, "kv_cache", t, 4), 0, 0, 0};
  require(c.v.contiguous(), fn, c.v, "must be contiguous");
  require(c.v.size[2] == 2, fn, c.v, "must be [num_blocks, num_kv_heads, 2, block_size * head_size]");
  require(head_size > 0 && c.v.size[3] % head_size == 0, fn, c.v,
          "last dimension is not a multiple of the head size " + std::to_string(head_size));
  c.num_blocks = c.v.size[0];
  c.num_kv_heads = c.v.size[1];
  c.block_size = c.v.size[3] / head_size;
  return c;
}

// The step's query offsets, sequence lengths and block table (int32), parsed once.
struct AttnIndex {
  View qsl, sl, bt;
};

inline AttnIndex attn_index(const char* fn, py::handle query_start_loc, py::handle seq_lens, py::handle block_table) {
  AttnIndex ix{index_view(fn, "query_start_loc", query_start_loc, 1, kI32),
               index_view(fn, "seq_lens", seq_lens, 1, kI32), index_view(fn, "block_table", block_table, 2, kI32)};
  require(ix.qsl.size[0] == ix.sl.size[0] + 1, fn, ix.qsl, "must hold len(seq_lens) + 1 offsets");
  require(ix.bt.size[0] >= ix.sl.size[0], fn, ix.bt, "has fewer rows than seq_lens");
  return ix;
}

// The index's values against T query tokens and a cache of c's blocks.
inline void check_attn_index(const char* fn, const AttnIndex& ix, int64_t T, const Cache& c) {
  const int64_t R = ix.sl.size[0];
  const int32_t* off = ix.qsl.data<int32_t>();
  const int32_t* lens = ix.sl.data<int32_t>();
  require(off[0] == 0 && off[R] <= T, fn, ix.qsl, "must start at 0 and end within query's tokens");
  for (int64_t i = 0; i < R; ++i) {
    const int64_t qlen = off[i + 1] - off[i];
    require(qlen >= 0 && lens[i] >= qlen, fn, ix.sl, "is shorter than a request's query tokens");
    const int64_t nblk = (lens[i] + c.block_size - 1) / c.block_size;
    require(nblk <= ix.bt.size[1], fn, ix.bt, "is narrower than a sequence's blocks");
    const int32_t* row = ix.bt.data<int32_t>() + i * ix.bt.stride[0];
    for (int64_t j = 0; j < nblk; ++j)
      require(row[j] >= 0 && row[j] < c.num_blocks, fn, ix.bt, "names a block outside kv_cache");
  }
}

// Attention of query q into o over cache c (q, o checked here; the index by check_attn_index).
inline PagedAttentionArgs attention_args(const char* fn, const View& q, const View& o, const Cache& c,
                                         const AttnIndex& ix, float scale, int sliding_window, float soft_cap,
                                         int num_threads) {
  if (sliding_window < 0) fail(fn, "sliding_window must be >= 0 (0: full causal attention)");
  if (!(soft_cap >= 0.f)) fail(fn, "soft_cap must be >= 0 (0: no capping)");
  require(heads_packed(q), fn, q, "needs unit stride over head_size and packed heads");
  require(o.size[0] == q.size[0] && o.size[1] == q.size[1] && o.size[2] == q.size[2] && heads_packed(o),
          fn, o, "must be shaped like query " + q.shape() + " with packed heads");
  const int64_t H = q.size[1], D = q.size[2];
  require(c.v.size[3] == c.block_size * D, fn, c.v, "does not hold head size " + std::to_string(D));
  same_dtype(fn, q, o);
  same_dtype(fn, q, c.v);
  if (c.num_kv_heads <= 0 || H % c.num_kv_heads)
    fail(fn, "query's " + std::to_string(H) + " heads are not a multiple of the cache's " +
                 std::to_string(c.num_kv_heads) + " KV heads");
  PagedAttentionArgs a{};
  a.query = q.ptr;
  a.q_stride = q.stride[0];
  a.out = o.ptr;
  a.o_stride = o.stride[0];
  a.kv_cache = c.v.ptr;
  a.query_start_loc = ix.qsl.data<int32_t>();
  a.seq_lens = ix.sl.data<int32_t>();
  a.block_table = ix.bt.data<int32_t>();
  a.bt_stride = ix.bt.stride[0];
  a.num_reqs = (int)ix.sl.size[0];
  a.num_heads = (int)H;
  a.num_kv_heads = (int)c.num_kv_heads;
  a.head_size = (int)D;
  a.block_size = (int)c.block_size;
  a.scale = scale;
  a.dtype = q.dtype;
  a.num_threads = num_threads;
  a.sliding_window = sliding_window;
  a.soft_cap = soft_cap;
  return a;
}

// The query and out views given (parsed from tensors, or the buffers of a fused step).
inline PagedAttentionArgs paged_attention_args_of(const char* fn, const View& q, const View& o, py::handle kv_cache,
                                                  py::handle query_start_loc, py::handle seq_lens,
                                                  py::handle block_table, float scale, int sliding_window,
                                                  float soft_cap, int num_threads) {
  if (sliding_window < 0) fail(fn, "sliding_window must be >= 0 (0: full causal attention)");
  if (!(soft_cap >= 0.f)) fail(fn, "soft_cap must be >= 0 (0: no capping)");
  require(heads_packed(q), fn, q, "needs unit stride over head_size and packed heads");
  const Cache c = cache_view(fn, kv_cache, q.size[2]);
  const AttnIndex ix = attn_index(fn, query_start_loc, seq_lens, block_table);
  PagedAttentionArgs a = attention_args(fn, q, o, c, ix, scale, sliding_window, soft_cap, num_threads);
  check_attn_index(fn, ix, q.size[0], c);
  return a;
}

inline PagedAttentionArgs paged_attention_args(py::handle query, py::handle out, py::handle kv_cache,
                                               py::handle query_start_loc, py::handle seq_lens,
                                               py::handle block_table, float scale, int sliding_window,
                                               float soft_cap, int num_threads) {
  const char* fn = "paged_attention";
  return paged_attention_args_of(fn, float_view(fn, "query", query, 3), float_view(fn, "out", out, 3), kv_cache,
                                 query_start_loc, seq_lens, block_table, scale, sliding_window, soft_cap,
                                 num_threads);
}

// Writes of k, v (checked here) at the slots s (int64 [N], checked against c) into cache c.
inline WriteKVArgs write_args(const char* fn, const View& k, const View& v, const Cache& c, const View& s,
                              int num_threads) {
  require(k.stride[2] == 1, fn, k, "needs unit stride over head_size");
  require(v.stride[2] == 1 && v.size[0] == k.size[0] && v.size[1] == k.size[1] && v.size[2] == k.size[2],
          fn, v, "must be shaped like key " + k.shape() + " with unit stride over head_size");
  require(c.v.size[3] == c.block_size * k.size[2], fn, c.v, "does not hold head size " + std::to_string(k.size[2]));
  same_dtype(fn, c.v, k);
  same_dtype(fn, c.v, v);
  require(k.size[1] == c.num_kv_heads, fn, k, "does not have the cache's KV heads");
  const int64_t N = s.size[0];
  require(N <= k.size[0], fn, s, "has more slots than key has tokens");
  const int64_t* slots = s.data<int64_t>();
  const int64_t n_slots = c.num_blocks * c.block_size;
  for (int64_t i = 0; i < N; ++i)
    require(slots[i] < n_slots, fn, s, "names a slot outside kv_cache");
  WriteKVArgs a{};
  a.key = k.ptr;
  a.k_stride_tok = k.stride[0];
  a.k_stride_head = k.stride[1];
  a.value = v.ptr;
  a.v_stride_tok = v.stride[0];
  a.v_stride_head = v.stride[1];
  a.kv_cache = c.v.ptr;
  a.slot_mapping = slots;
  a.num_tokens = (int)N;
  a.num_kv_heads = (int)c.num_kv_heads;
  a.head_size = (int)k.size[2];
  a.block_size = (int)c.block_size;
  a.dtype = k.dtype;
  a.num_threads = num_threads;
  return a;
}

// The key and value views given (parsed from tensors, or the buffers of a fused step).
inline WriteKVArgs write_kv_args_of(const char* fn, const View& k, const View& v, py::handle kv_cache,
                                    py::handle slot_mapping, int num_threads) {
  require(k.stride[2] == 1, fn, k, "needs unit stride over head_size");
  const Cache c = cache_view(fn, kv_cache, k.size[2]);
  return write_args(fn, k, v, c, index_view(fn, "slot_mapping", slot_mapping, 1, kI64), num_threads);
}

inline WriteKVArgs write_kv_args(py::handle key, py::handle value, py::handle kv_cache,
                                 py::handle slot_mapping, int num_threads) {
  const char* fn = "write_kv";
  return write_kv_args_of(fn, float_view(fn, "key", key, 3), float_view(fn, "value", value, 3), kv_cache,
                          slot_mapping, num_threads);
}

inline View rows_view(const char* fn, const char* name, py::handle t) {
  View v = float_view(fn, name, t, 2);
  require(v.stride[1] == 1 && v.stride[0] >= v.size[1], fn, v, "needs unit inner stride and disjoint rows");
  return v;
}

inline void same_shape(const char* fn, const View& a, const View& b) {
  require(b.size[0] == a.size[0] && b.size[1] == a.size[1], fn, b, "must be shaped like " + std::string(a.name) + " " + a.shape());
  same_dtype(fn, a, b);
}

inline RMSNormArgs rms_norm_args(py::handle x, py::handle weight, py::handle out, float eps,
                                 py::handle residual, py::handle residual_out, int num_threads) {
  const char* fn = "rms_norm";
  const View xv = rows_view(fn, "x", x);
  const View w = float_view(fn, "weight", weight, 1);
  const View o = rows_view(fn, "out", out);
  require(w.size[0] == xv.size[1] && w.stride[0] == 1, fn, w, "must be contiguous [n] for x " + xv.shape());
  same_dtype(fn, xv, w);
  same_shape(fn, xv, o);
  RMSNormArgs a{};
  if (!residual.is_none()) {
    const View r = rows_view(fn, "residual", residual);
    const View ro = rows_view(fn, "residual_out", residual_out);
    same_shape(fn, xv, r);
    same_shape(fn, xv, ro);
    a.residual = r.ptr;
    a.r_stride = r.stride[0];
    a.residual_out = ro.ptr;
    a.ro_stride = ro.stride[0];
  } else if (!residual_out.is_none()) {
    fail(fn, "residual_out is given without residual");
  }
  a.x = xv.ptr;
  a.x_stride = xv.stride[0];
  a.weight = w.ptr;
  a.out = o.ptr;
  a.o_stride = o.stride[0];
  a.rows = xv.size[0];
  a.n = (int)xv.size[1];
  a.eps = eps;
  a.dtype = xv.dtype;
  a.num_threads = num_threads;
  return a;
}

inline ArgmaxArgs row_argmax_args(py::handle x, py::handle out, int num_threads) {
  const char* fn = "row_argmax";
  const View xv = rows_view(fn, "x", x);
  const View o = index_view(fn, "out", out, 1, kI64);
  require(xv.size[1] > 0, fn, xv, "must have a non-empty last dimension");
  require(o.size[0] == xv.size[0], fn, o, "must be [rows] for x " + xv.shape());
  ArgmaxArgs a{};
  a.x = xv.ptr;
  a.x_stride = xv.stride[0];
  a.out = reinterpret_cast<int64_t*>(o.ptr);
  a.rows = xv.size[0];
  a.n = xv.size[1];
  a.dtype = xv.dtype;
  a.num_threads = num_threads;
  return a;
}

inline SiluMulArgs silu_and_mul_args(py::handle x, py::handle out, int num_threads) {
  const char* fn = "silu_and_mul";
  const View xv = rows_view(fn, "x", x);
  const View o = rows_view(fn, "out", out);
  require(xv.size[1] % 2 == 0, fn, xv, "must have an even last dimension (gate | up)");
  require(o.size[0] == xv.size[0] && o.size[1] == xv.size[1] / 2, fn, o, "must be [rows, n] for x " + xv.shape());
  same_dtype(fn, xv, o);
  SiluMulArgs a{};
  a.x = xv.ptr;
  a.x_stride = xv.stride[0];
  a.out = o.ptr;
  a.o_stride = o.stride[0];
  a.rows = xv.size[0];
  a.n = (int)o.size[1];
  a.dtype = xv.dtype;
  a.num_threads = num_threads;
  return a;
}

inline RopeArgs rope_args(py::handle positions, py::handle q, py::handle k, py::handle cos,
                          py::handle sin, py::handle q_out, py::handle k_out, int num_threads) {
  const char* fn = "rope";
  const View qv = float_view(fn, "q", q, 3);
  const View kv = float_view(fn, "k", k, 3);
  const int64_t T = qv.size[0], D = qv.size[2];
  require(qv.stride[2] == 1, fn, qv, "needs unit stride over head_size");
  require(kv.stride[2] == 1 && kv.size[0] == T && kv.size[2] == D, fn, kv, "must be [T, Hk, D] for q " + qv.shape());
  const View c = float_view(fn, "cos", cos, 2);
  const View s = float_view(fn, "sin", sin, 2);
  require(c.contiguous() && c.size[1] == D, fn, c, "must be a contiguous [max_position, head_size] table");
  require(s.contiguous() && s.size[0] == c.size[0] && s.size[1] == D, fn, s, "must be shaped like cos " + c.shape());
  const View qo = float_view(fn, "q_out", q_out, 3);
  const View ko = float_view(fn, "k_out", k_out, 3);
  require(qo.contiguous() && qo.size[0] == T && qo.size[1] == qv.size[1] && qo.size[2] == D, fn, qo,
          "must be contiguous and shaped like q " + qv.shape());
  require(ko.contiguous() && ko.size[0] == T && ko.size[1] == kv.size[1] && ko.size[2] == D, fn, ko,
          "must be contiguous and shaped like k " + kv.shape());
  for (const View* v : {&kv, &c, &s, &qo, &ko}) same_dtype(fn, qv, *v);
  const View p = index_view(fn, "positions", positions, 1, kI64);
  require(p.size[0] == T, fn, p, "must hold one position per token of q " + qv.shape());
  const int64_t* pos = p.data<int64_t>();
  for (int64_t i = 0; i < T; ++i)
    require(pos[i] >= 0 && pos[i] < c.size[0], fn, p, "holds a position outside the cos/sin tables");
  RopeArgs a{};
  a.q = qv.ptr;
  a.q_stride_tok = qv.stride[0];
  a.q_stride_head = qv.stride[1];
  a.k = kv.ptr;
  a.k_stride_tok = kv.stride[0];
  a.k_stride_head = kv.stride[1];
  a.q_out = qo.ptr;
  a.k_out = ko.ptr;
  a.positions = pos;
  a.cos = c.ptr;
  a.sin = s.ptr;
  a.num_tokens = T;
  a.num_q_heads = (int)qv.size[1];
  a.num_k_heads = (int)kv.size[1];
  a.head_size = (int)D;
  a.dtype = qv.dtype;
  a.num_threads = num_threads;
  return a;
}

}  // namespace bind
}  // namespace octavo
