"""The ONNX Runtime model runner under octavo's engine: preemption by recompute on a small
paged cache, sampling features the sampler applies, and the flags it refuses (by name)."""

from __future__ import annotations

import shutil

import pytest

from octavo import LLM, SamplingParams
from tests.hf_reference import random_prompts


def test_preemption_recomputes_identically(onnx_exports, llama_dir):
    prompts = random_prompts(500, [30, 41, 17, 60], seed=8)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    reqs = [{"prompt_token_ids": p} for p in prompts]
    ref = LLM(llama_dir, dtype="float32", block_size=16, max_model_len=128)
    expected = [o.outputs[0].token_ids for o in ref.generate(reqs, params, use_tqdm=False)]
    # 12 blocks x 16 tokens cannot hold four 70-100 token sequences at once: preemption.
    llm = LLM(onnx_exports["llama"], block_size=16, max_model_len=128, num_gpu_blocks_override=12)
    outs = llm.generate(reqs, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    core = llm.llm_engine.core
    assert core.scheduler.num_preemptions > 0
    mgr = core.scheduler.kv_cache_manager
    assert mgr.block_pool.get_num_free_blocks() == 12 - 1  # nothing leaked (block 0 is the null block)


def test_seeded_sampling_and_logprobs(onnx_exports):
    llm = LLM(onnx_exports["llama"], max_model_len=128)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=6, logprobs=2, prompt_logprobs=1)
    a, b = (llm.generate(["def f("], params, use_tqdm=False)[0] for _ in range(2))
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert len(a.outputs[0].logprobs) == 6 and all(len(d) >= 2 for d in a.outputs[0].logprobs)
    assert a.prompt_logprobs[0] is None and all(d for d in a.prompt_logprobs[1:])


def test_auto_picks_onnxruntime_for_an_export(onnx_exports, llama_dir):
    llm = LLM(onnx_exports["llama"], max_model_len=64)
    assert llm.llm_engine.config.model_config.model_impl == "onnxruntime"
    assert llm.llm_engine.config.model_config.dtype.is_floating_point
    with pytest.raises(ValueError, match="model.onnx or genai_config.json"):
        LLM(llama_dir, model_impl="onnxruntime", max_model_len=64)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"quantization": "fp8"}, r"--quantization .* quantize at export"),
        ({"load_format": "dummy"}, r"--load-format .* must be auto \(ONNX Runtime runs the exported model"),
        ({"kv_cache_dtype": "fp8"}, r"--kv-cache-dtype"),
        ({"dtype": "bfloat16"}, r"--dtype .* exported as float32"),
        ({"model_impl": "transformers"}, r"--model-impl .* auto, octavo, onnxruntime"),
    ],
)
def test_refused_flags_name_themselves(onnx_exports, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(onnx_exports["llama"], max_model_len=64, **kwargs)


def test_export_cli_writes_the_genai_layout(checkpoints, tmp_path):
    import json

    import onnx

    from octavo.entrypoints.cli import main

    out = tmp_path / "qwen2"
    assert main(["export", "onnx", checkpoints["qwen2"], "--output", str(out)]) == 0
    for name in ("model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json", "tokenizer_config.json",
                 "config.json"):
        assert (out / name).is_file(), name
    cfg = json.loads((out / "genai_config.json").read_text())
    dec = cfg["model"]["decoder"]
    assert (dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"]) == (2, 2, 16)
    assert dec["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert cfg["model"]["type"] == "qwen2" and cfg["search"]["past_present_share_buffer"] is False
    proto = onnx.load(str(out / "model.onnx"), load_external_data=False)

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    ins = {v.name: dims(v) for v in proto.graph.input}
    outs = {v.name: dims(v) for v in proto.graph.output}
    assert ins["input_ids"] == ["batch_size", "sequence_length"]
    assert ins["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert ins["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 16]
    assert outs["logits"] == ["batch_size", "sequence_length", 512]
    assert outs["present.0.key"] == ["batch_size", 2, "total_sequence_length", 16]
    # A second export into the same folder is refused; bad option combinations too.
    assert main(["export", "onnx", checkpoints["qwen2"], "--output", str(out)]) == 2
    assert main(["export", "onnx", checkpoints["qwen2"], "--output", str(tmp_path / "x"),
                 "--dtype", "fp16", "--quantize", "int4"]) == 2
    shutil.rmtree(out)


def test_fp16_export_runs_in_float16(checkpoints, tmp_path):
    from octavo.engine.model_files import load_hf_config
    from octavo.onnx.export import export_onnx

    src = checkpoints["llama"]
    hf_config, arch = load_hf_config(src)
    out = export_onnx(src, hf_config, arch, str(tmp_path / "fp16"), "fp16", None, 256)
    llm = LLM(str(out), max_model_len=128)
    assert str(llm.llm_engine.config.model_config.dtype) == "torch.float16"
    assert llm.llm_engine.core.runner.model.cache.dtype.itemsize == 2
    res = llm.generate(["def f("], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert len(res[0].outputs[0].token_ids) == 12


def test_session_threads_do_not_spin_between_runs(onnx_exports):
    """ONNX Runtime's pool threads must sleep after a run: torch ops of the same step (KV
    gather/scatter, sampling) use the same cores in between."""
    llm = LLM(onnx_exports["llama"], max_model_len=64)
    opts = llm.llm_engine.core.runner.model.session.get_session_options()
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
