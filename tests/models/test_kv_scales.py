"""Checkpoint KV cache scales (``octavo.models.kv_scales``): ``self_attn.k_scale`` /
``v_scale`` (and the older ``k_proj.output_scale`` / ``v_proj.output_scale``) load onto the
attention layers; with ``--kv-cache-dtype auto`` the cache keeps the model's dtype, the log says
the scales are not used, and the output is the checkpoint's without them; malformed or partial
scales are refused. (On a GPU, ``--kv-cache-dtype fp8`` hands them to the kernels:
tests/quantization/test_cuda.py.)"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo import LLM, SamplingParams


def _with_scales(src: str, dst, names: dict[str, float], declare: bool = True):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors.update({n: torch.tensor(v, dtype=torch.float32) for n, v in names.items()})
    save_file(tensors, str(dst / "model.safetensors"))
    if declare:  # a compressed-tensors config whose only scheme is the KV cache's
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {},
            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                "symmetric": True}}
        (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def _scales(layers: int, old_names: bool = False) -> dict[str, float]:
    k, v = ("k_proj.output_scale", "v_proj.output_scale") if old_names else ("k_scale", "v_scale")
    out = {}
    for i in range(layers):
        out[f"model.layers.{i}.self_attn.{k}"] = 0.25 * (i + 1)
        out[f"model.layers.{i}.self_attn.{v}"] = 0.5 * (i + 1)
    return out


@pytest.mark.parametrize("old_names", [False, True])
def test_scales_load_and_auto_cache_says_they_are_unused(llama_dir, tmp_path, caplog, old_names):
    d = _with_scales(llama_dir, tmp_path / "ckpt", _scales(2, old_names))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 9, 14, 3, 7]}
    with caplog.at_level(logging.INFO, logger="octavo.models.kv_scales"):
        llm = LLM(d, dtype="float32")
    attn = llm.llm_engine.core.runner.model.attention_layers()
    assert [a.kv_scales for a in attn] == [{"k_scale": 0.25, "v_scale": 0.5}, {"k_scale": 0.5, "v_scale": 1.0}]
    assert "KV cache scales (2 layers) are not used" in caplog.text
    want = LLM(llama_dir, dtype="float32").generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids == want


@pytest.mark.parametrize("names,declare,message", [
    ({"model.layers.0.self_attn.k_scale": 0.5}, False, r"missing for the attention layers \[0\]"),
    ({**_scales(2), "model.layers.1.self_attn.v_scale": -1.0}, True, "must be positive and finite"),
], ids=["partial", "negative"])
def test_bad_scales_are_refused(llama_dir, tmp_path, names, declare, message):
    d = _with_scales(llama_dir, tmp_path / "ckpt", names, declare)
    with pytest.raises(ValueError, match=message):
        LLM(d, dtype="float32")


def test_a_scale_per_channel_is_refused(llama_dir, tmp_path):
    d = _with_scales(llama_dir, tmp_path / "ckpt", _scales(2))
    tensors = load_file(f"{d}/model.safetensors")
    tensors["model.layers.0.self_attn.k_scale"] = torch.ones(4)
    save_file(tensors, f"{d}/model.safetensors")
    with pytest.raises(ValueError, match=r"k_scale'.*one value per layer"):
        LLM(d, dtype="float32")
