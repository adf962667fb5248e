"""Persistent step buffers (CPU-checkable parts) and CUDA-graph decode steps (on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.platforms.cpu import CpuPlatform
from octavo.worker.cuda_graph import StepBuffers, capture_sizes

HAS_GPU = torch.cuda.is_available()


def test_capture_sizes():
    assert capture_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 8))
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(1024)[-1] == 256


def _batch():
    bt = np.zeros((4, 6), dtype=np.int32)
    bt[0, :2] = [5, 9]
    bt[1, :3] = [2, 7, 3]
    bt[2, :1] = [11]
    return bt


def test_stage_eager_layout():
    buf = StepBuffers(16, 4, 6, 16, torch.device("cpu"), CpuPlatform)
    bt = _batch()
    rows = np.array([1, 0])
    ids, pos = np.array([4, 5, 6, 7]), np.array([32, 33, 34, 20])
    slots = np.array([48, 49, 50, 148])
    qsl, sl = np.array([0, 3, 4]), np.array([35, 21])
    [md], (t_ids, t_pos) = buf.stage(ids, pos, [slots], qsl, sl, [bt], rows, 3, 3)
    assert t_ids.tolist() == ids.tolist() and t_pos.tolist() == pos.tolist()
    assert md.slot_mapping.tolist() == slots.tolist()
    assert md.query_start_loc.tolist() == [0, 3, 4]
    assert md.seq_lens.tolist() == [35, 21]
    assert md.block_table.tolist() == [[2, 7, 3], [5, 9, 0]]
    assert md.block_table.is_contiguous()
    assert (md.num_reqs, md.num_actual_tokens, md.max_query_len, md.max_seq_len) == (2, 4, 3, 35)


def test_stage_padded_decode_layout():
    buf = StepBuffers(16, 4, 6, 16, torch.device("cpu"), CpuPlatform)
    bt = _batch()
    rows = np.array([2, 0, 1])
    [md], (t_ids, _) = buf.stage(
        np.array([1, 2, 3]), np.array([3, 20, 40]), [np.array([179, 148, 56])],
        np.array([0, 1, 2, 3]), np.array([4, 21, 41]), [bt], rows, 3, 1, pad_to=4,
    )
    assert t_ids.tolist() == [1, 2, 3]
    # Padding row 3: a one-token dummy decode that writes nothing and reads the null block.
    assert buf.slot[:4].tolist() == [179, 148, 56, -1]
    assert buf.qsl[:5].tolist() == [0, 1, 2, 3, 4]
    assert buf.sl[:4].tolist() == [4, 21, 41, 1]
    full = buf.bt[:24].view(4, 6)
    assert full[:3].tolist() == bt[rows].tolist() and full[3].tolist() == [0] * 6
    assert md.block_table.tolist() == bt[rows].tolist()
    # The graph's static metadata sees the same buffers at full width.
    [gmd] = buf.graph_metadata(4, 96)
    assert gmd.block_table.shape == (4, 6) and gmd.block_table.data_ptr() == buf.bt.data_ptr()


def test_stage_padded_uniform_verify_layout():
    """A verify step of 2 requests with 2 drafts each (3 query tokens per row) padded to a
    4-row graph: the padding rows are 3-token dummy chunks that write nothing and read the null
    block, so the captured kernels' uniform layout holds."""
    buf = StepBuffers(16, 4, 6, 16, torch.device("cpu"), CpuPlatform)
    bt = _batch()
    rows = np.array([1, 0])
    [md], (t_ids, _) = buf.stage(
        np.arange(1, 7), np.array([32, 33, 34, 18, 19, 20]), [np.array([48, 49, 50, 146, 147, 148])],
        np.array([0, 3, 6]), np.array([35, 21]), [bt], rows, 3, 3, pad_to=4,
    )
    assert t_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert buf.ids[:12].tolist() == [1, 2, 3, 4, 5, 6] + [0] * 6
    assert buf.slot[:12].tolist() == [48, 49, 50, 146, 147, 148] + [-1] * 6
    assert buf.qsl[:5].tolist() == [0, 3, 6, 9, 12]
    assert buf.sl[:4].tolist() == [35, 21, 3, 3]
    assert (md.num_reqs, md.num_actual_tokens, md.max_query_len) == (2, 6, 3)
    [gmd] = buf.graph_metadata(4, 96, q=3)
    assert (gmd.num_reqs, gmd.num_actual_tokens, gmd.max_query_len) == (4, 12, 3)
    assert gmd.slot_mapping.data_ptr() == buf.slot.data_ptr() and len(gmd.slot_mapping) == 12
    buf.fill_dummy(4, q=3)
    assert buf.qsl[:5].tolist() == [0, 3, 6, 9, 12] and buf.sl[:4].tolist() == [3] * 4
    assert (buf.slot[:12] == -1).all()


def test_graph_plan_replays_uniform_steps_only():
    from types import SimpleNamespace

    from octavo.worker.cuda_graph import GraphRunner

    runner = SimpleNamespace(step_buffers=StepBuffers(40, 16, 6, 16, torch.device("cpu"), CpuPlatform))
    gr = GraphRunner(runner, capture_sizes(16), verify_query_lens=(2, 3, 4, 5))
    assert gr.plan == {1: [1, 2, 4, 8, 16], 2: [1, 2, 4, 8], 3: [1, 2, 4, 8], 4: [1, 2, 4, 8], 5: [1, 2, 4, 8]}
    assert gr.padded_size(3, 3, 1) == 4 and gr.padded_size(16, 16, 1) == 16
    assert gr.padded_size(3, 15, 5) == 4  # 3 requests x (1 + 4 drafts)
    assert gr.padded_size(3, 13, 5) is None  # mixed draft counts: eager
    assert gr.padded_size(9, 45, 5) is None  # past the verify sizes: eager
    assert gr.padded_size(2, 12, 6) is None  # more drafts than configured: eager
    assert GraphRunner(runner, [1, 2, 4, 8], verify_query_lens=(9,)).plan[9] == [1, 2, 4]  # 8 x 9 > 40 tokens
    gr.enabled = False
    assert gr.padded_size(1, 1, 1) is None


def test_mixed_capture_sizes():
    from octavo.worker.cuda_graph import mixed_capture_sizes

    assert mixed_capture_sizes(2048) == [32, 64, 128, 256, 512, 1024, 1536, 2048]
    assert mixed_capture_sizes(100) == [32, 64, 100]
    assert mixed_capture_sizes(8192) == [32, 64, 128, 256, 512] + list(range(1024, 4097, 512)) + [5120, 6144, 7168, 8192]
    assert mixed_capture_sizes(1 << 20)[-1] == 16384
    for limit in (40, 700, 3000, 9000, 16384):
        sizes = mixed_capture_sizes(limit)
        pairs = list(zip(sizes, sizes[1:], strict=False))
        assert sizes[-1] == limit and pairs
        # Padding: at most half of a replayed step up to 1024 tokens, a third past it.
        assert all(b <= 2 * a for a, b in pairs) and all(2 * b <= 3 * a for a, b in pairs if a >= 1024)


def test_graph_plan_replays_mixed_steps_no_decode_graph_takes():
    from types import SimpleNamespace

    from octavo.worker.cuda_graph import GraphRunner

    # 16 requests at most (+1 padding row), 64 tokens per step.
    runner = SimpleNamespace(step_buffers=StepBuffers(64, 17, 6, 16, torch.device("cpu"), CpuPlatform))
    gr = GraphRunner(runner, capture_sizes(16), mixed_sizes=[32, 64, 128])
    assert gr.mixed_sizes == [32, 64]  # 128 tokens do not fit the buffers
    assert gr.padded_size(3, 3, 1) == 4 and gr.mixed_size(3, 3, 1) is None  # a decode graph takes it
    assert gr.mixed_size(3, 20, 18) == 32 and gr.mixed_size(16, 64, 49) == 64
    assert gr.mixed_size(3, 65, 60) is None  # past the largest: eager
    assert gr.mixed_size(17, 20, 4) is None  # no row left for the padding
    decode_sizes, gr.plan[1] = gr.plan[1], [1, 2, 4, 8]  # decodes past the decode graphs: eager
    assert gr.padded_size(12, 12, 1) is None and gr.mixed_size(12, 12, 1) is None
    gr.plan[1] = decode_sizes
    gr.mixed_enabled = False
    assert gr.mixed_size(3, 20, 18) is None and gr.padded_size(3, 3, 1) == 4
    gr.mixed_enabled, gr.enabled = True, False
    assert gr.mixed_size(3, 20, 18) is None


def test_stage_one_table_per_kv_cache_group():
    """A mixed full/sliding-window model: each group's slots and block table go to its own
    buffers; everything else is shared; graphs see every group's table at full width."""
    buf = StepBuffers(16, 4, 6, 16, torch.device("cpu"), CpuPlatform, num_kv_groups=2)
    full = _batch()
    window = full.copy()
    window[1, :2] = 0  # blocks behind the window were freed: the null block
    window[1, 2] = 8
    rows = np.array([1, 0])
    qsl, sl = np.array([0, 1, 2]), np.array([35, 21])
    slots = [np.array([50, 148]), np.array([130, 148])]
    mds, _ = buf.stage(np.array([4, 5]), np.array([34, 20]), slots, qsl, sl, [full, window], rows, 3, 1)
    assert [m.block_table.tolist() for m in mds] == [[[2, 7, 3], [5, 9, 0]], [[0, 0, 8], [5, 9, 0]]]
    assert [m.slot_mapping.tolist() for m in mds] == [[50, 148], [130, 148]]
    assert mds[1].seq_lens is mds[0].seq_lens and mds[1].query_start_loc is mds[0].query_start_loc
    mds, _ = buf.stage(np.array([4, 5]), np.array([34, 20]), slots, qsl, sl, [full, window], rows, 3, 1, pad_to=4)
    assert buf.slots[1][2][:4].tolist() == [130, 148, -1, -1]
    assert buf.bts[1][2][:24].view(4, 6)[:2].tolist() == window[rows].tolist()
    gmds = buf.graph_metadata(4, 96)
    assert [g.block_table.data_ptr() for g in gmds] == [bt[2].data_ptr() for bt in buf.bts]
    buf.fill_dummy(4)
    assert all((slot[2][:4] == -1).all() and not bt[2][:24].any() for slot, bt in zip(buf.slots, buf.bts, strict=True))


# -- GPU: engines end to end --------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")


def _force_platform(monkeypatch, name):
    from octavo.platforms import reset_current_platform

    monkeypatch.setenv("OCTAVO_PLATFORM", name)
    reset_current_platform()


LENGTHS = [1, 15, 16, 17, 33, 64, 100, 300]
MAX_TOKENS = 12
# Every architecture, including sliding-window (32-token windows: the longer prompts cross
# them), soft-capping (gemma2), per-type RoPE (gemma3), fused checkpoints + longrope (phi3).
GPU_ARCHS = ["llama", "mistral", "qwen2", "qwen3", "mistral_sw", "qwen2_sw", "gemma2", "gemma3", "phi3", "phi3_partial"]
ARCH_KWARGS: dict[str, dict] = {}


def _arch_kwargs(path) -> dict:
    from pathlib import Path

    return ARCH_KWARGS.get(Path(path).name, {})


def _generate(path, monkeypatch, platform, **kw):
    from octavo import LLM, SamplingParams
    from tests.hf_reference import random_prompts

    _force_platform(monkeypatch, platform)
    try:
        llm = LLM(path, block_size=16, max_num_batched_tokens=64, max_num_seqs=3, **kw, **_arch_kwargs(path))
        vocab = llm.llm_engine.config.model_config.vocab_size
        prompts = random_prompts(vocab, LENGTHS, seed=7)
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
            use_tqdm=False,
        )
        return llm, prompts, [o.outputs[0].token_ids for o in outs]
    finally:
        from octavo.platforms import reset_current_platform

        monkeypatch.delenv("OCTAVO_PLATFORM")
        reset_current_platform()


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("arch", GPU_ARCHS)
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_fp32_greedy_identical_to_cpu(arch, enforce_eager, checkpoints, monkeypatch):
    monkeypatch.setenv("OCTAVO_MIXED_GRAPHS", "1")  # the opt-in mixed-step graphs too
    _, _, cpu_tokens = _generate(checkpoints[arch], monkeypatch, "cpu", dtype="float32")
    llm, _, gpu_tokens = _generate(
        checkpoints[arch], monkeypatch, "cuda", dtype="float32", enforce_eager=enforce_eager
    )
    runner = llm.llm_engine.core.runner
    assert runner.attn_backend.name == "triton_paged"
    assert (runner.graph_runner is None) == enforce_eager
    if not enforce_eager:  # prefill chunks among decodes replayed from the mixed graphs
        assert runner.graph_runner.mixed_sizes == [32, 64] and runner.graph_runner.mixed_replays > 0
    assert gpu_tokens == cpu_tokens


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("arch,num_blocks", [("gemma2", 32), ("gemma3", 64), ("qwen2_sw", 32)])
def test_mixed_model_kv_groups_on_gpu(arch, num_blocks, checkpoints, monkeypatch):
    """Mixed full/sliding-window models on the GPU: one block table per KV cache group in the
    persistent buffers and the captured decode graphs, a pool small enough to preempt, and
    prefix caching; fp32 tokens identical to the CPU, and no block leaks."""
    kw = dict(dtype="float32", num_gpu_blocks_override=num_blocks, enable_prefix_caching=True)
    _, _, cpu_tokens = _generate(checkpoints[arch], monkeypatch, "cpu", **kw)
    llm, _, gpu_tokens = _generate(checkpoints[arch], monkeypatch, "cuda", **kw)
    runner = llm.llm_engine.core.runner
    assert runner.graph_runner is not None and runner.num_kv_groups > 1
    assert len(runner.step_buffers.slots) == runner.num_kv_groups
    assert len(runner.kv_caches) == runner.num_kv_tensors < len(runner.model.attention_layers())
    assert gpu_tokens == cpu_tokens
    sched = llm.llm_engine.core.scheduler
    kv = sched.kv_cache_manager
    assert sched.num_preemptions > 0
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("arch", GPU_ARCHS)
def test_bf16_logprobs_close_to_cpu_fp32(arch, checkpoints, monkeypatch):
    """Teacher-forced prompt logprobs of the fp32 greedy continuation, bf16 GPU vs fp32 CPU."""
    from octavo import LLM, SamplingParams

    _, prompts, cpu_tokens = _generate(checkpoints[arch], monkeypatch, "cpu", dtype="float32")
    seqs = [p + t for p, t in zip(prompts, cpu_tokens, strict=True)]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)

    def logprobs(platform, dtype):
        _force_platform(monkeypatch, platform)
        llm = LLM(checkpoints[arch], dtype=dtype, block_size=16, max_num_seqs=4, **ARCH_KWARGS.get(arch, {}))
        outs = llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
        res = []
        for s, o in zip(seqs, outs, strict=True):
            res.append([o.prompt_logprobs[i][s[i]].logprob for i in range(1, len(s))])
        return res

    ref = logprobs("cpu", "float32")
    got = logprobs("cuda", "bfloat16")
    monkeypatch.delenv("OCTAVO_PLATFORM")
    from octavo.platforms import reset_current_platform

    reset_current_platform()
    diffs = np.concatenate([np.abs(np.array(a) - np.array(b)) for a, b in zip(got, ref, strict=True)])
    print(f"{arch}: bf16 vs fp32 |dlogprob| mean {diffs.mean():.4f} p99 {np.quantile(diffs, 0.99):.4f} max {diffs.max():.4f}")
    assert diffs.mean() < 0.05 and np.quantile(diffs, 0.99) < 0.3


@pytest.mark.cuda
@needs_gpu
def test_memory_profile_and_kv_budget(checkpoints, monkeypatch):
    from octavo import LLM

    _force_platform(monkeypatch, "cuda")
    llm = LLM(checkpoints["llama"], dtype="bfloat16", gpu_memory_utilization=0.3, max_num_seqs=16)
    runner = llm.llm_engine.core.runner
    assert runner.profiled_peak_bytes > 0 and runner.profiled_graph_pool_bytes > 0
    free, total = torch.cuda.mem_get_info()
    kv = runner.num_blocks * runner.kv_bytes_per_block()
    # The cache fits under the utilisation target with everything else that is allocated.
    assert kv <= 0.3 * total
    assert runner.graph_runner is not None and runner.graph_runner.sizes == [1, 2, 4, 8, 16]
    monkeypatch.delenv("OCTAVO_PLATFORM")
    from octavo.platforms import reset_current_platform

    reset_current_platform()
