// One Llama-family decoder layer's decode step in one extension call (the fused path of
// octavo/models/cpu_decode_layer.py): RMSNorm(+residual), QKV GEMV, RoPE, K/V write + paged
// attention, O GEMV, RMSNorm + residual, gate/up GEMV, SiLU*mul, down GEMV. The same kernels
// with the same arguments in the same order as the per-op path, so the outputs are equal bit
// for bit; what goes is the Python between them (ten calls, a dozen tensor allocations, splits
// and views per layer, ~5 ms of a 45 ms step at 48 rows on a 2-core Xeon). Intermediates live
// in a per-thread scratch buffer; only the two outputs are tensors. Included by bindings.cpp.
#pragma once

#include <string.h>

#include <vector>

#include "gemv_args.h"
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

// The checked arguments of every kernel of the step, pointing into ``scratch``.
struct LayerStep {
  RMSNormArgs norm1, norm2;
  GemvArgs qkv, o, gate_up, down;
  RopeArgs rope;
  PagedAttentionArgs attn;
  WriteKVArgs write;
  SiluMulArgs silu;
  uint16_t* attn_out = nullptr;  // rows past the written tokens (padding) are zeroed first
  int64_t attn_rows = 0, written = 0, attn_row_elems = 0;
};

struct LayerShape {
  int64_t t, dim, nh, nkv, hd, inter;
};

// Byte offsets of the step's intermediates in the scratch buffer (64-byte aligned).
struct ScratchLayout {
  size_t x, r1, qkv, q_rot, k_rot, attn, o, x2, gate_up, h, bytes;
  explicit ScratchLayout(const LayerShape& s) {
    size_t at = 0;
    auto take = [&at](int64_t elems) {
      const size_t here = at;
      at += ((size_t)elems * 2 + 63) & ~(size_t)63;
      return here;
    };
    const int64_t qkv_n = (s.nh + 2 * s.nkv) * s.hd;
    x = take(s.t * s.dim); r1 = take(s.t * s.dim); qkv = take(s.t * qkv_n);
    q_rot = take(s.t * s.nh * s.hd); k_rot = take(s.t * s.nkv * s.hd); attn = take(s.t * s.nh * s.hd);
    o = take(s.t * s.dim); x2 = take(s.t * s.dim); gate_up = take(s.t * 2 * s.inter); h = take(s.t * s.inter);
    bytes = at;
  }
};

inline RMSNormArgs norm_of(const char* fn, const char* name, py::handle weight, int64_t dim, float eps,
                           const void* x, const void* residual, void* out, void* residual_out, int64_t rows,
                           int threads) {
  const View w = view(fn, name, weight, 1);
  require(w.dtype == kBF16 && w.size[0] == dim && w.stride[0] == 1, fn, w,
          "must be contiguous bfloat16 [" + std::to_string(dim) + "]");
  RMSNormArgs a{};
  a.x = x;
  a.x_stride = dim;
  a.residual = residual;
  a.r_stride = dim;
  a.residual_out = residual_out;
  a.ro_stride = dim;
  a.weight = w.ptr;
  a.out = out;
  a.o_stride = dim;
  a.rows = rows;
  a.n = (int)dim;
  a.eps = eps;
  a.dtype = kBF16;
  a.num_threads = threads;
  return a;
}

// [t, dim] contiguous bfloat16, or fails naming ``name``.
inline View hidden_view(const char* fn, const char* name, py::handle t, int64_t rows, int64_t dim) {
  const View v = rows_view(fn, name, t);
  require(v.dtype == kBF16 && v.contiguous() && (rows < 0 || (v.size[0] == rows && v.size[1] == dim)), fn, v,
          rows < 0 ? "must be contiguous bfloat16 [tokens, hidden]"
                   : "must be contiguous bfloat16 [" + std::to_string(rows) + ", " + std::to_string(dim) + "]");
  return v;
}

struct LayerTensors {  // what the step reads and writes, as the binding receives it
  py::handle hidden, residual, hidden_out, residual_out, norm1, norm2;
  float eps1, eps2;
  py::handle qkv_w, qkv_b, o_w, o_b, gate_up_w, gate_up_b, down_w, down_b;
  py::handle positions, cos, sin;
  int num_heads, num_kv_heads;
  py::handle kv_cache, slot_mapping, query_start_loc, seq_lens, block_table;
  float scale;
  int sliding_window;
  float soft_cap;
  int num_threads;
};

// Checks every tensor of a step once and fills the kernels' arguments; the intermediates go
// into ``scratch`` (grown as needed, 64-byte aligned). ``residual`` None: the first layer (the
// residual stream is ``hidden`` itself). A mismatch is a ValueError "decoder_layer: ...".
inline LayerStep layer_step_args(std::vector<char>& scratch, const LayerTensors& in) {
  const char* fn = "decoder_layer";
  const int threads = in.num_threads;
  const View h = hidden_view(fn, "hidden", in.hidden, -1, 0);
  const int64_t t = h.size[0], dim = h.size[1];
  const View cv = float_view(fn, "cos", in.cos, 2);
  const View dw = view(fn, "down_weight", in.down_w, 4);
  require(in.num_heads > 0 && in.num_kv_heads > 0 && in.num_heads % in.num_kv_heads == 0, fn, h,
          "num_heads must be a positive multiple of num_kv_heads");
  const LayerShape shp{t, dim, in.num_heads, in.num_kv_heads, cv.size[1], dw.size[1] * 2};
  const int64_t hd = shp.hd, nh = shp.nh, nkv = shp.nkv, qkv_n = (nh + 2 * nkv) * hd;
  const ScratchLayout at(shp);
  if (scratch.size() < at.bytes + 64) scratch.resize(at.bytes + 64);
  char* base = (char*)(((uintptr_t)scratch.data() + 63) & ~(uintptr_t)63);
  auto buf = [base](size_t off) { return (uint16_t*)(base + off); };

  const View ho = hidden_view(fn, "hidden_out", in.hidden_out, t, dim);
  const View ro = hidden_view(fn, "residual_out", in.residual_out, t, dim);
  const void* res = h.ptr;  // the residual stream after the first norm
  LayerStep st;
  if (!in.residual.is_none()) {
    const View r = hidden_view(fn, "residual", in.residual, t, dim);
    st.norm1 = norm_of(fn, "norm1", in.norm1, dim, in.eps1, h.ptr, r.ptr, buf(at.x), buf(at.r1), t, threads);
    res = buf(at.r1);
  } else {
    st.norm1 = norm_of(fn, "norm1", in.norm1, dim, in.eps1, h.ptr, nullptr, buf(at.x), nullptr, t, threads);
  }
  const PackedLinear qkv = packed_linear(fn, "qkv_weight", in.qkv_w, in.qkv_b, dim, qkv_n);
  const PackedLinear o = packed_linear(fn, "o_weight", in.o_w, in.o_b, nh * hd, dim);
  const PackedLinear gu = packed_linear(fn, "gate_up_weight", in.gate_up_w, in.gate_up_b, dim, 2 * shp.inter);
  const PackedLinear down = packed_linear(fn, "down_weight", in.down_w, in.down_b, shp.inter, dim);
  st.qkv = gemv_of(qkv, (const uint16_t*)buf(at.x), t, dim, buf(at.qkv), threads);
  st.o = gemv_of(o, buf(at.attn), t, nh * hd, buf(at.o), threads);
  st.norm2 = norm_of(fn, "norm2", in.norm2, dim, in.eps2, buf(at.o), res, buf(at.x2), ro.ptr, t, threads);
  st.gate_up = gemv_of(gu, buf(at.x2), t, dim, buf(at.gate_up), threads);
  st.down = gemv_of(down, buf(at.h), t, shp.inter, (uint16_t*)ho.ptr, threads);
  st.silu = SiluMulArgs{buf(at.gate_up), 2 * shp.inter, buf(at.h), shp.inter, t, (int)shp.inter, kBF16, threads};

  // RoPE of the q and k column ranges of qkv into q_rot, k_rot (as rope_args checks them)
  const View sv = float_view(fn, "sin", in.sin, 2);
  require(cv.dtype == kBF16 && cv.contiguous() && hd % 16 == 0 && hd > 0, fn, cv,
          "must be a contiguous bfloat16 [max_position, head_size] table");
  require(sv.dtype == kBF16 && sv.contiguous() && sv.size[0] == cv.size[0] && sv.size[1] == hd, fn, sv,
          "must be shaped like cos " + cv.shape());
  const View p = index_view(fn, "positions", in.positions, 1, kI64);
  require(p.size[0] == t, fn, p, "must hold one position per token of hidden " + h.shape());
  const int64_t* pos = p.data<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    require(pos[i] >= 0 && pos[i] < cv.size[0], fn, p, "holds a position outside the cos/sin tables");
  st.rope = RopeArgs{buf(at.qkv), qkv_n, hd, buf(at.qkv) + nh * hd, qkv_n, hd, buf(at.q_rot), buf(at.k_rot),
                     pos, cv.ptr, sv.ptr, t, (int)nh, (int)nkv, (int)hd, kBF16, threads};

  // K/V write + attention: q_rot, k_rot and v (a column range of qkv) as views
  const int64_t q_sz[3] = {t, nh, hd}, q_st[3] = {nh * hd, hd, 1};
  const int64_t k_sz[3] = {t, nkv, hd}, k_st[3] = {nkv * hd, hd, 1}, v_st[3] = {qkv_n, hd, 1};
  const View qv = buffer_view("query", buf(at.q_rot), 3, q_sz, q_st);
  const View av = buffer_view("out", buf(at.attn), 3, q_sz, q_st);
  const View kv = buffer_view("key", buf(at.k_rot), 3, k_sz, k_st);
  const View vv = buffer_view("value", buf(at.qkv) + (nh + nkv) * hd, 3, k_sz, v_st);
  st.attn = paged_attention_args_of(fn, qv, av, in.kv_cache, in.query_start_loc, in.seq_lens, in.block_table,
                                    in.scale, in.sliding_window, in.soft_cap, threads);
  st.write = write_kv_args_of(fn, kv, vv, in.kv_cache, in.slot_mapping, threads);
  st.attn_out = buf(at.attn);
  st.attn_rows = t;
  st.written = st.write.num_tokens;
  st.attn_row_elems = nh * hd;
  return st;
}

}  // namespace bind
}  // namespace octavo
