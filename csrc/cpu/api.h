// octavo CPU kernels: the ISA-independent interface.
//
// Every kernel takes one argument struct of raw pointers and sizes; the pybind11 layer
// (bindings.cpp) fills it from torch tensors after checking their dtypes, shapes, strides and
// index ranges, once per call. Nothing here links against libtorch. The same kernel source
// (kernels_impl.h) is compiled once per ISA into its own namespace (octavo::isa_<name>), so one
// binary may hold several variants side by side (the standalone test does).
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace octavo {

enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// KV cache layout (one tensor per layer, shape [num_blocks, num_kv_heads, 2, block_size * head_size]):
// for block b and KV head h the K tile is at ((b * num_kv_heads + h) * 2 + 0) * block_size * head_size
// and the V tile right after it. Inside a tile, with P = 4 / sizeof(element) (2 for bf16/fp16,
// 1 for fp32):
//   K (transposed): element (t, d) at (d / P) * block_size * P + t * P + d % P
//       i.e. K^T [head_size / P][block_size][P]: a row of 16 consecutive tokens x P dims is one
//       vector load, so Q.K^T is a broadcast-FMA micro-GEMM with no horizontal reductions.
//       (A row-major K tile measured slower; csrc/cpu/README.md has the numbers.)
//   V: element (t, d) at (t / P) * head_size * P + d * P + t % P
//       i.e. V [block_size / P][head_size][P]: 16 consecutive dims x P tokens per vector load.
// P = 2 packs the two bf16 operands of one avx512_bf16 dot-product lane next to each other.

struct WriteKVArgs;

struct PagedAttentionArgs {
  const void* query;   // [num_tokens, num_heads, head_size] rows of q_stride elements
  int64_t q_stride;    // elements between tokens
  void* out;           // [num_tokens, num_heads, head_size], o_stride elements between tokens
  int64_t o_stride;
  const void* kv_cache;
  const int32_t* query_start_loc;  // [num_reqs + 1]
  const int32_t* seq_lens;         // [num_reqs]
  const int32_t* block_table;      // [num_reqs, bt_stride]
  int64_t bt_stride;
  int num_reqs;
  int num_heads;
  int num_kv_heads;
  int head_size;
  int block_size;
  float scale;
  int dtype;        // DType of query, out and the cache
  int num_threads;  // 0: the OpenMP runtime's current default (torch's intra-op pool size)
  // > 0: sliding-window attention, a query at position p sees keys (p - sliding_window, p]
  // only; blocks wholly before every row's window are never read (their block-table entries
  // may be stale or the null block). 0: full causal attention.
  int sliding_window = 0;
  // > 0: scores become soft_cap * tanh(scale * q.k / soft_cap) before the softmax (Gemma 2).
  float soft_cap = 0.f;
  // 0: never the AMX tiles (comparisons); else bf16 attention runs Q.K^T and P.V on them where
  // the variant has the path and the CPU grants the tile state (Kernels::attention_amx).
  int allow_amx = 1;
  // Optional: first write the batch's new K/V (as write_kv does; its tokens are the query's).
  // A decode token is written by the work item that then reads its block (its cache lines
  // come in once), every other token before any item runs. nullptr: the cache holds them.
  const WriteKVArgs* write = nullptr;
};

struct WriteKVArgs {
  const void* key;  // [num_tokens, num_kv_heads, head_size] with the strides below (elements)
  int64_t k_stride_tok, k_stride_head;
  const void* value;
  int64_t v_stride_tok, v_stride_head;
  void* kv_cache;
  const int64_t* slot_mapping;  // [num_tokens]; negative = skip (padding)
  int num_tokens;
  int num_kv_heads;
  int head_size;
  int block_size;
  int dtype;
  int num_threads;
};

// Small per-layer ops (numerically ordered like octavo/models/layers.py: round to the model
// dtype exactly where the eager torch code rounds).
struct RMSNormArgs {
  const void* x; int64_t x_stride;       // [rows, n]
  const void* residual; int64_t r_stride; // may be null
  const void* weight;                    // [n]
  void* out; int64_t o_stride;
  void* residual_out; int64_t ro_stride; // x + residual (when residual is given)
  int64_t rows;
  int n;
  float eps;
  int dtype;
  int num_threads;
};

struct SiluMulArgs {
  const void* x; int64_t x_stride;  // [rows, 2n] = gate | up
  void* out; int64_t o_stride;      // [rows, n]
  int64_t rows;
  int n;
  int dtype;
  int num_threads;
};

struct ArgmaxArgs {
  // out[r] = the index of the first maximum of row r of x [rows, n] (a NaN counts as the
  // maximum: the first NaN), as torch.argmax / torch.max(dim=-1).indices on a CPU.
  const void* x; int64_t x_stride;
  int64_t* out;  // [rows]
  int64_t rows, n;
  int dtype;
  int num_threads;
};

struct RopeArgs {
  // Neox-style rotation of q [T, Hq, D] and k [T, Hk, D] (strided views allowed) into
  // contiguous outputs, with cos/sin tables [max_pos, D] in the model dtype.
  const void* q; int64_t q_stride_tok, q_stride_head;
  const void* k; int64_t k_stride_tok, k_stride_head;
  void* q_out;  // [T, Hq, D] contiguous
  void* k_out;  // [T, Hk, D] contiguous
  const int64_t* positions;
  const void* cos; const void* sin;  // [max_pos, D]
  int64_t num_tokens;
  int num_q_heads, num_k_heads, head_size;
  int dtype;
  int num_threads;
};

// One ISA variant's kernels. Each ISA namespace exports `const Kernels* kernels()`.
struct Kernels {
  const char* isa;
  bool bf16_dot;  // uses VDPBF16PS for bf16 caches
  // nullptr on success, else why the arguments are unsupported (nothing was computed)
  const char* (*paged_attention)(const PagedAttentionArgs&);
  const char* (*write_kv)(const WriteKVArgs&);
  void (*rms_norm)(const RMSNormArgs&);
  void (*silu_and_mul)(const SiluMulArgs&);
  void (*rope)(const RopeArgs&);
  bool (*attention_amx)();  // bf16 paged attention runs on AMX tiles (allow_amx) in this process
  void (*row_argmax)(const ArgmaxArgs&);
};

// threading.cpp (compiled once, without ISA flags)
namespace threading {
// Use the OpenMP runtime that is already loaded in the process (torch's) so attention runs on
// the same thread team as torch's GEMMs: no second pool spinning against the first.
bool init_openmp_from_library(const char* path, char* err, size_t err_len);
void set_openmp(void* gomp_parallel, void* omp_get_thread_num, void* omp_get_max_threads);
bool have_openmp();
int resolve_threads(int requested);
// fn(ctx, item, tid) for item in [0, n_items), items handed out dynamically; tid < threads.
void parallel_run(int64_t n_items, int threads, void (*fn)(void*, int64_t, int), void* ctx);
// Pin thread i of the OpenMP team to cpus[i]; the caller is thread 0 and is pinned only with
// pin_caller. Returns the number of threads pinned.
int bind_threads(const int* cpus, int n, bool pin_caller);
}  // namespace threading

}  // namespace octavo
