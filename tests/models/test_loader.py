"""The safetensors loader: sharded checkpoints, missing tensors, dummy weights."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo import LLM, SamplingParams


def test_sharded_checkpoint_loads_identically(llama_dir, tmp_path):
    d = tmp_path / "sharded"
    shutil.copytree(llama_dir, d)
    tensors = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(d / fname))
        weight_map.update({k: fname for k in keys})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    params = SamplingParams(temperature=0, max_tokens=6)
    prompt = {"prompt_token_ids": [3, 4, 5, 6, 7]}
    a = LLM(llama_dir, dtype="float32").generate(prompt, params, use_tqdm=False)
    b = LLM(str(d), dtype="float32").generate(prompt, params, use_tqdm=False)
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids


def test_missing_tensor_is_named(llama_dir, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(llama_dir, d)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing tensors: .*layers\.1\.self_attn\.qkv_proj\.weight\[k\]"):
        LLM(str(d))


def test_dummy_load_format_runs_without_weights(llama_dir, tmp_path):
    d = tmp_path / "config-only"
    d.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{llama_dir}/{f}", d / f)
    llm = LLM(str(d), load_format="dummy", dtype="float32")
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    w = llm.llm_engine.core.runner.model.model.layers[0].mlp.down_proj.weight
    assert torch.count_nonzero(w) > 0
