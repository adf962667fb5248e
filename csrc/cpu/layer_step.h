// A Llama-family decoder layer's decode step in one extension call, and a whole stack of them
// (the fused paths of octavo/models/cpu_decode_layer.py): RMSNorm(+residual), QKV linear, RoPE,
// K/V write + paged attention, O linear, RMSNorm + residual, gate/up linear, SiLU*mul, down linear.
// A linear is the bf16 GEMV over its packed weight, or a weight-only INT8 / INT4 weight
// (quant_api.h) through int_linear, or int_linear_a8 where the packed weight says its
// activations are int8 -- whichever the per-op path (cpu_int.int_linear) would call.
// The same kernels with the same arguments in the same order as the per-op path, so the
// outputs are equal bit for bit; what goes is the Python between them (ten calls, a dozen
// tensor allocations, splits and views per layer: ~5 ms of a 45 ms step at 48 rows on a 2-core
// Xeon, and ~80 us per layer of interpreter work that runs with the caches the kernels just
// flushed). Intermediates live in a per-thread scratch buffer; only the outputs are tensors.
// A layer's constants (weights, tables, cache) are checked into a LayerPlan; a DecoderStack
// keeps the plans of every layer, so a step checks only the step's tensors, once.
// Included by bindings.cpp.
#pragma once

#include <string.h>

#include <vector>

#include "gemv_args.h"
#include "quant_args.h"
#include "tensor_args.h"

namespace octavo {
namespace bind {

// A contiguous bf16 buffer of the step seen as a tensor view (for the checked-args builders).
inline View buffer_view(const char* name, void* ptr, int ndim, const int64_t* size, const int64_t* stride) {
  View v;
  v.name = name;
  v.ptr = (char*)ptr;
  v.dtype = kBF16;
  v.ndim = ndim;
  for (int i = 0; i < ndim; ++i) {
    v.size[i] = size[i];
    v.stride[i] = stride[i];
  }
  return v;
}

// A GEMV weight packed [n / 16, k / 2, 16, 2] (bf16) with its optional bias [n].
struct PackedLinear {
  const uint16_t* w = nullptr;
  const uint16_t* bias = nullptr;
  int64_t n = 0;
};

inline PackedLinear packed_linear(const char* fn, const char* name, py::handle weight, py::handle bias,
                                  int64_t k, int64_t n) {
  const View w = view(fn, name, weight, 4);
  require(w.dtype == kBF16, fn, w, "must be bfloat16");
  require(w.contiguous() && w.size[2] == 16 && w.size[3] == 2 && w.size[1] * 2 == k && w.size[0] * 16 == n, fn, w,
          "must be the packed layout [" + std::to_string(n / 16) + ", " + std::to_string(k / 2) + ", 16, 2]");
  PackedLinear p;
  p.w = w.data<uint16_t>();
  p.n = n;
  if (!bias.is_none()) {
    const View b = view(fn, "bias", bias, 1);
    require(b.dtype == kBF16 && b.size[0] == n && (b.stride[0] == 1 || n == 1), fn, b,
            "must be contiguous bfloat16 [" + std::to_string(n) + "]");
    p.bias = b.data<uint16_t>();
  }
  return p;
}

inline GemvArgs gemv_of(const PackedLinear& l, const uint16_t* x, int64_t m, int64_t k, uint16_t* out, int threads) {
  GemvArgs a{};
  a.x = x;
  a.x_stride = k;
  a.w = l.w;
  a.bias = l.bias;
  a.out = out;
  a.o_stride = l.n;
  a.m = m;
  a.n = l.n;
  a.k = k;
  a.num_threads = threads;
  return a;
}


// How the step runs one linear (see the file comment); n, k: output and input features.
enum LinearKind : int { kLinearGemv = 0, kLinearInt = 1, kLinearIntA8 = 2 };
struct LinearPlan {
  int kind = kLinearGemv;
  PackedLinear gemv;      // kLinearGemv
  IntWeights q{};         // kLinearInt / kLinearIntA8
  const float* qbias = nullptr;  // the int kernels add a float32 bias
  float input_scale = 0.f;       // kLinearIntA8: > 0 a static activation scale
  bool amx = false;              // the int kernels may take their AMX path
  int dp_min_rows = 0;           // > 0: bf16 batches of this many rows may take the VDPBF16PS path
  int64_t n = 0, k = 0;
};

// An INT8 / INT4 linear is passed as an object with cpu_int.PackedInt's attributes.
inline bool is_int_linear(py::handle weight) { return py::hasattr(weight, "bits"); }

// The input features of a linear's weight (packed bf16 [n / 16, k / 2, 16, 2], or PackedInt).
inline int64_t linear_in_features(const char* fn, const char* name, py::handle weight) {
  if (is_int_linear(weight)) return weight.attr("k").cast<int64_t>();
  return view(fn, name, weight, 4).size[1] * 2;
}

inline LinearPlan linear_plan(const char* fn, const char* name, py::handle weight, py::handle bias, int64_t k,
                              int64_t n) {
  LinearPlan l;
  l.n = n;
  l.k = k;
  if (!is_int_linear(weight)) {
    l.gemv = packed_linear(fn, name, weight, bias, k, n);
    return l;
  }
  const int64_t wn = weight.attr("n").cast<int64_t>(), wk = weight.attr("k").cast<int64_t>();
  if (wn != n || wk != k)
    fail(fn, std::string(name) + " is a quantized [" + std::to_string(wn) + ", " + std::to_string(wk) +
                 "] weight, must be [" + std::to_string(n) + ", " + std::to_string(k) + "]");
  l.q = int_weights(fn, weight.attr("weight"), weight.attr("scales"), weight.attr("zeros"), (int)n, (int)k,
                    weight.attr("group").cast<int>(), weight.attr("bits").cast<int>(),
                    weight.attr("zero_point").cast<float>());
  l.kind = weight.attr("a8").cast<bool>() ? kLinearIntA8 : kLinearInt;
  l.input_scale = weight.attr("input_scale").cast<float>();
  l.amx = weight.attr("amx").cast<bool>();
  l.dp_min_rows = weight.attr("dp_min_rows").cast<int>();
  if (!bias.is_none()) {
    const View b = view(fn, "bias", bias, 1);
    require(b.dtype == kF32 && b.size[0] == n && b.stride[0] == 1, fn, b,
            "of a quantized linear must be contiguous float32 [" + std::to_string(n) + "]");
    l.qbias = b.data<float>();
  }
  return l;
}

// One linear's call: x [m, k] (rows k apart) -> out [m, n] (rows n apart), bf16.
struct LinearCall {
  int kind = kLinearGemv;
  GemvArgs gemv{};
  IntLinearArgs q{};
};

inline LinearCall linear_call(const LinearPlan& l, const uint16_t* x, int64_t m, uint16_t* out, int threads) {
  LinearCall c;
  c.kind = l.kind;
  if (l.kind == kLinearGemv) {
    c.gemv = gemv_of(l.gemv, x, m, l.k, out, threads);
    return c;
  }
  IntLinearArgs& a = c.q;
  a.w = l.q;
  a.x = x;
  a.x_stride = l.k;
  a.out = out;
  a.o_stride = l.n;
  a.bias = l.qbias;
  a.m = m;
  a.dtype = kBF16;
  a.num_threads = threads;
  a.allow_amx = l.amx ? 1 : 0;
  a.dp_min_rows = l.dp_min_rows;
  a.input_scale = l.input_scale;
  return c;
}

struct LayerShape {
  int64_t dim, nh, nkv, hd, inter;
};

// What a layer reads besides the step's tensors, checked once.
struct LayerPlan {
  LayerShape shape;
  const void* norm1 = nullptr;
  const void* norm2 = nullptr;
  float eps1 = 0.f, eps2 = 0.f;
  LinearPlan qkv, o, gate_up, down;
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t max_pos = 0;
  Cache cache;
  float scale = 0.f;
  int window = 0;
  float soft_cap = 0.f;
};

// Byte offsets of a step's intermediates in the scratch buffer (64-byte aligned); h/r: the
// two (hidden, residual) pairs a stack's layers pass along, alternately.
struct ScratchLayout {
  size_t x, r1, qkv, q_rot, k_rot, attn, o, x2, gate_up, h, pair_h[2], pair_r[2], bytes;
  ScratchLayout(const LayerShape& s, int64_t t) {
    size_t at = 0;
    auto take = [&at](int64_t elems) {
      const size_t here = at;
      at += ((size_t)elems * 2 + 63) & ~(size_t)63;
      return here;
    };
    const int64_t qkv_n = (s.nh + 2 * s.nkv) * s.hd;
    x = take(t * s.dim); r1 = take(t * s.dim); qkv = take(t * qkv_n);
    q_rot = take(t * s.nh * s.hd); k_rot = take(t * s.nkv * s.hd); attn = take(t * s.nh * s.hd);
    o = take(t * s.dim); x2 = take(t * s.dim); gate_up = take(t * 2 * s.inter); h = take(t * s.inter);
    for (int i = 0; i < 2; ++i) { pair_h[i] = take(t * s.dim); pair_r[i] = take(t * s.dim); }
    bytes = at;
  }
};

inline char* scratch_base(std::vector<char>& scratch, size_t bytes) {
  if (scratch.size() < bytes + 64) scratch.resize(bytes + 64);
  return (char*)(((uintptr_t)scratch.data() + 63) & ~(uintptr_t)63);
}

inline const void* norm_weight(const char* fn, const char* name, py::handle weight, int64_t dim) {
  const View w = view(fn, name, weight, 1);
  require(w.dtype == kBF16 && w.size[0] == dim && w.stride[0] == 1, fn, w,
          "must be contiguous bfloat16 [" + std::to_string(dim) + "]");
  return w.ptr;
}

inline RMSNormArgs norm_of(const void* weight, int64_t dim, float eps, const void* x, const void* residual,
                           void* out, void* residual_out, int64_t rows, int threads) {
  RMSNormArgs a{};
  a.x = x;
  a.x_stride = dim;
  a.residual = residual;
  a.r_stride = dim;
  a.residual_out = residual_out;
  a.ro_stride = dim;
  a.weight = weight;
  a.out = out;
  a.o_stride = dim;
  a.rows = rows;
  a.n = (int)dim;
  a.eps = eps;
  a.dtype = kBF16;
  a.num_threads = threads;
  return a;
}

// [t, dim] contiguous bfloat16 (rows < 0: any rows, dim any), or fails naming ``name``.
inline View hidden_view(const char* fn, const char* name, py::handle t, int64_t rows, int64_t dim) {
  const View v = rows_view(fn, name, t);
  require(v.dtype == kBF16 && v.contiguous() && (rows < 0 || (v.size[0] == rows && v.size[1] == dim)), fn, v,
          rows < 0 ? "must be contiguous bfloat16 [tokens, hidden]"
                   : "must be contiguous bfloat16 [" + std::to_string(rows) + ", " + std::to_string(dim) + "]");
  return v;
}

// A layer's constants, as the bindings receive them (keyword names of decoder_layer).
struct LayerConsts {
  py::handle norm1, norm2;
  float eps1, eps2;
  py::handle qkv_w, qkv_b, o_w, o_b, gate_up_w, gate_up_b, down_w, down_b, cos, sin, kv_cache;
  float scale;
  int sliding_window;
  float soft_cap;
};

inline LayerPlan layer_plan(const char* fn, const LayerConsts& in, int64_t dim, int num_heads, int num_kv_heads) {
  if (!(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0))
    fail(fn, "num_heads must be a positive multiple of num_kv_heads");
  if (in.sliding_window < 0) fail(fn, "sliding_window must be >= 0 (0: full causal attention)");
  if (!(in.soft_cap >= 0.f)) fail(fn, "soft_cap must be >= 0 (0: no capping)");
  const View cv = float_view(fn, "cos", in.cos, 2);
  const View sv = float_view(fn, "sin", in.sin, 2);
  LayerPlan p;
  p.shape = LayerShape{dim, num_heads, num_kv_heads, cv.size[1], linear_in_features(fn, "down_weight", in.down_w)};
  const int64_t hd = p.shape.hd, nh = num_heads, nkv = num_kv_heads;
  require(cv.dtype == kBF16 && cv.contiguous() && hd % 16 == 0 && hd > 0, fn, cv,
          "must be a contiguous bfloat16 [max_position, head_size] table");
  require(sv.dtype == kBF16 && sv.contiguous() && sv.size[0] == cv.size[0] && sv.size[1] == hd, fn, sv,
          "must be shaped like cos " + cv.shape());
  p.cos = cv.ptr;
  p.sin = sv.ptr;
  p.max_pos = cv.size[0];
  p.norm1 = norm_weight(fn, "norm1", in.norm1, dim);
  p.norm2 = norm_weight(fn, "norm2", in.norm2, dim);
  p.eps1 = in.eps1;
  p.eps2 = in.eps2;
  p.qkv = linear_plan(fn, "qkv_weight", in.qkv_w, in.qkv_b, dim, (nh + 2 * nkv) * hd);
  p.o = linear_plan(fn, "o_weight", in.o_w, in.o_b, nh * hd, dim);
  p.gate_up = linear_plan(fn, "gate_up_weight", in.gate_up_w, in.gate_up_b, dim, 2 * p.shape.inter);
  p.down = linear_plan(fn, "down_weight", in.down_w, in.down_b, p.shape.inter, dim);
  p.cache = cache_view(fn, in.kv_cache, hd);
  require(p.cache.v.dtype == kBF16 && p.cache.num_kv_heads == nkv, fn, p.cache.v,
          "must be a bfloat16 cache of " + std::to_string(nkv) + " KV heads");
  p.scale = in.scale;
  p.window = in.sliding_window;
  p.soft_cap = in.soft_cap;
  return p;
}

// The step's own tensors, checked once for every layer of a stack.
struct StepIO {
  int64_t t;
  const int64_t* pos;
  AttnIndex ix;
  View slots;
};

inline StepIO step_io(const char* fn, int64_t t, py::handle positions, py::handle slot_mapping,
                      py::handle query_start_loc, py::handle seq_lens, py::handle block_table) {
  StepIO io{t, nullptr, attn_index(fn, query_start_loc, seq_lens, block_table),
            index_view(fn, "slot_mapping", slot_mapping, 1, kI64)};
  const View p = index_view(fn, "positions", positions, 1, kI64);
  require(p.size[0] == t, fn, p, "must hold one position per token of hidden");
  io.pos = p.data<int64_t>();
  return io;
}

// The step's values against a layer's tables and cache (the same for every layer of a stack).
inline void check_step(const char* fn, const StepIO& io, const LayerPlan& p) {
  for (int64_t i = 0; i < io.t; ++i)
    if (io.pos[i] < 0 || io.pos[i] >= p.max_pos) fail(fn, "positions holds a position outside the cos/sin tables");
  check_attn_index(fn, io.ix, io.t, p.cache);
}

// The checked arguments of every kernel of one layer's step, pointing into the scratch at
// ``base``; (h_in, r_in) -> (h_out, r_out), r_in nullptr for the first layer.
struct LayerStep {
  RMSNormArgs norm1, norm2;
  LinearCall qkv, o, gate_up, down;
  RopeArgs rope;
  PagedAttentionArgs attn;
  WriteKVArgs write;
  SiluMulArgs silu;
  uint16_t* attn_out = nullptr;  // rows past the written tokens (padding) are zeroed first
  int64_t attn_rows = 0, written = 0, attn_row_elems = 0;
};

inline LayerStep fill_layer(const char* fn, const LayerPlan& p, const ScratchLayout& at, char* base,
                            const StepIO& io, const void* h_in, const void* r_in, void* h_out, void* r_out,
                            int threads) {
  auto buf = [base](size_t off) { return (uint16_t*)(base + off); };
  const LayerShape& s = p.shape;
  const int64_t t = io.t, dim = s.dim, hd = s.hd, nh = s.nh, nkv = s.nkv, qkv_n = (nh + 2 * nkv) * hd;
  LayerStep st;
  const void* res = h_in;  // the residual stream after the first norm
  if (r_in) {
    st.norm1 = norm_of(p.norm1, dim, p.eps1, h_in, r_in, buf(at.x), buf(at.r1), t, threads);
    res = buf(at.r1);
  } else {
    st.norm1 = norm_of(p.norm1, dim, p.eps1, h_in, nullptr, buf(at.x), nullptr, t, threads);
  }
  st.qkv = linear_call(p.qkv, buf(at.x), t, buf(at.qkv), threads);
  st.rope = RopeArgs{buf(at.qkv), qkv_n, hd, buf(at.qkv) + nh * hd, qkv_n, hd, buf(at.q_rot), buf(at.k_rot),
                     io.pos, p.cos, p.sin, t, (int)nh, (int)nkv, (int)hd, kBF16, threads};
  const int64_t q_sz[3] = {t, nh, hd}, q_st[3] = {nh * hd, hd, 1};
  const int64_t k_sz[3] = {t, nkv, hd}, k_st[3] = {nkv * hd, hd, 1}, v_st[3] = {qkv_n, hd, 1};
  st.attn = attention_args(fn, buffer_view("query", buf(at.q_rot), 3, q_sz, q_st),
                           buffer_view("out", buf(at.attn), 3, q_sz, q_st), p.cache, io.ix, p.scale, p.window,
                           p.soft_cap, threads);
  st.write = write_args(fn, buffer_view("key", buf(at.k_rot), 3, k_sz, k_st),
                        buffer_view("value", buf(at.qkv) + (nh + nkv) * hd, 3, k_sz, v_st), p.cache, io.slots,
                        threads);
  st.attn_out = buf(at.attn);
  st.attn_rows = t;
  st.written = st.write.num_tokens;
  st.attn_row_elems = nh * hd;
  st.o = linear_call(p.o, buf(at.attn), t, buf(at.o), threads);
  st.norm2 = norm_of(p.norm2, dim, p.eps2, buf(at.o), res, buf(at.x2), r_out, t, threads);
  st.gate_up = linear_call(p.gate_up, buf(at.x2), t, buf(at.gate_up), threads);
  st.silu = SiluMulArgs{buf(at.gate_up), 2 * s.inter, buf(at.h), s.inter, t, (int)s.inter, kBF16, threads};
  st.down = linear_call(p.down, buf(at.h), t, (uint16_t*)h_out, threads);
  return st;
}

// Every layer of a model's decoder stack (same shapes and cache geometry), planned once.
struct DecoderStack {
  std::vector<LayerPlan> plans;
  py::list keep;  // the tensors the plans point into, kept alive
  int64_t dim = 0;

  DecoderStack(py::list layers, int64_t hidden_size, int num_heads, int num_kv_heads) : keep(layers), dim(hidden_size) {
    const char* fn = "DecoderStack";
    if (layers.size() == 0) fail(fn, "needs at least one layer");
    for (py::handle l : layers) {
      py::dict d = py::reinterpret_borrow<py::dict>(l);
      const LayerConsts c{d["norm1"], d["norm2"], d["eps1"].cast<float>(), d["eps2"].cast<float>(),
                          d["qkv_weight"], d["qkv_bias"], d["o_weight"], d["o_bias"], d["gate_up_weight"],
                          d["gate_up_bias"], d["down_weight"], d["down_bias"], d["cos"], d["sin"], d["kv_cache"],
                          d["scale"].cast<float>(), d["sliding_window"].cast<int>(), d["soft_cap"].cast<float>()};
      plans.push_back(layer_plan(fn, c, hidden_size, num_heads, num_kv_heads));
      const LayerPlan& a = plans.front();
      const LayerPlan& b = plans.back();
      if (b.shape.hd != a.shape.hd || b.shape.inter != a.shape.inter || b.cache.num_blocks != a.cache.num_blocks ||
          b.cache.block_size != a.cache.block_size || b.max_pos != a.max_pos)
        fail(fn, "layers differ in head size, MLP width, cache geometry or position tables");
    }
  }
};

}  // namespace bind
}  // namespace octavo
