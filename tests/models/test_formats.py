"""Checkpoint formats: pytorch_model*.bin and GGUF give what the safetensors fixture gives.

The .bin files and GGUF files are written here from the fixtures (``torch.save``; the ``gguf``
package, laid out as llama.cpp's converter writes them). Peak host memory of a streaming load
is measured in a fresh interpreter and reported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo import LLM, SamplingParams
from tests.fixtures.gguf_writer import write_gguf

PROMPTS = [list(range(3, 40)), [5, 9, 200, 31, 7]]
PARAMS = SamplingParams(temperature=0, max_tokens=10)


def _greedy(path: str, **kw) -> list[list[int]]:
    outs = LLM(path, dtype="float32", **kw).generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _copy_without_weights(src: str, dst) -> None:
    dst.mkdir()
    for f in os.listdir(src):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(src, f), dst / f)


def test_pytorch_bin_matches_safetensors(llama_dir, tmp_path):
    d = tmp_path / "bin"
    _copy_without_weights(llama_dir, d)
    torch.save(load_file(os.path.join(llama_dir, "model.safetensors")), d / "pytorch_model.bin")
    assert _greedy(str(d)) == _greedy(llama_dir)


def test_sharded_pytorch_bin_with_index(llama_dir, tmp_path):
    d = tmp_path / "bin-sharded"
    _copy_without_weights(llama_dir, d)
    tensors = load_file(os.path.join(llama_dir, "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        fname = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save({k: tensors[k] for k in part}, d / fname)
        weight_map.update(dict.fromkeys(part, fname))
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert _greedy(str(d), load_format="pt") == _greedy(llama_dir)


def test_pickled_code_in_bin_is_refused(llama_dir, tmp_path):
    d = tmp_path / "evil"
    _copy_without_weights(llama_dir, d)
    torch.save({"x": os.getcwd}, d / "pytorch_model.bin")  # a callable: not loadable with weights_only
    with pytest.raises(ValueError, match="weights_only=True"):
        LLM(str(d))


@pytest.mark.parametrize("arch", ["mistral", "qwen3"])
def test_gguf_f32_matches_safetensors_with_gguf_tokenizer(arch, checkpoints, tmp_path):
    src = checkpoints[arch]
    path = write_gguf(src, tmp_path / f"{arch}.gguf", "F32", arch="llama" if arch == "mistral" else arch)
    llm = LLM(str(path), dtype="float32")
    from transformers import AutoTokenizer

    text = "def hello(world): return 中文 🙂 the cache<|im_end|>"
    assert llm.get_tokenizer().encode(text) == AutoTokenizer.from_pretrained(src).encode(text)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == _greedy(src)


def _params(llm: LLM) -> dict[str, torch.Tensor]:
    return dict(llm.llm_engine.core.runner.model.named_parameters())


# Largest error of one weight after the storage type's rounding (relative to the tensor's max).
_TOLERANCE = {"F16": 2**-10, "BF16": 2**-7, "Q8_0": 1 / 127}


@pytest.mark.parametrize("qtype", sorted(_TOLERANCE))
def test_gguf_dequantized_weights(qtype, checkpoints, tmp_path):
    """F16/BF16/Q8_0 weights arrive dequantized within the type's rounding error, q/k unpermuted."""
    src = checkpoints["mistral"]
    ref = _params(LLM(src, dtype="float32"))
    llm = LLM(str(write_gguf(src, tmp_path / "m.gguf", qtype)), dtype="float32", tokenizer=src)
    got = _params(llm)
    assert got.keys() == ref.keys()
    for name, r in ref.items():
        err = (got[name] - r).abs().max().item()
        assert err <= _TOLERANCE[qtype] * r.abs().max().item() + 1e-7, (name, err)
        assert err > 0 or r.dim() == 1  # really stored as qtype (norms stay F32)
    out = llm.generate({"prompt_token_ids": PROMPTS[0]}, PARAMS, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == PARAMS.max_tokens or out[0].outputs[0].finish_reason == "stop"


def test_gguf_unsupported_type_is_named(checkpoints, tmp_path):
    path = write_gguf(checkpoints["mistral"], tmp_path / "q4.gguf", "Q4_0")
    with pytest.raises(ValueError, match=r"GGUF tensor '[\w.]+' has type Q4_0; octavo dequantizes F32, F16, BF16, Q8_0"):
        LLM(str(path), dtype="float32")


_PEAK_SCRIPT = r"""
import json, sys, torch
from octavo.engine.arg_utils import EngineArgs
from octavo.models.loader import load_weights
from octavo.models.registry import resolve_architecture
from octavo.platforms import current_platform

cfg = EngineArgs(model=sys.argv[1], dtype="float32", load_format=sys.argv[2]).create_engine_config()
mc = cfg.model_config
backend, _ = current_platform.get_attn_backend(mc.head_size, mc.dtype, "auto", cfg.cache_config.block_size)
_, cls = resolve_architecture([mc.architecture])
model = cls(mc.hf_config, backend, mc.dtype, mc.max_model_len)
for p in model.parameters():
    p.data.fill_(0.5)  # every page resident before the measurement starts

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident size
before = status("VmRSS")
load_weights(model, sys.argv[1], sys.argv[2])
print(json.dumps({"growth": status("VmHWM") - before,
                  "model": sum(p.numel() * p.element_size() for p in model.parameters())}))
"""


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_streaming_load_peak_host_memory(fmt, tmp_path):
    """Loading adds about one shard (+ one tensor) to resident memory, not the whole checkpoint."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=512, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
        tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
    )
    d = tmp_path / "ckpt"
    d.mkdir()
    cfg.save_pretrained(d)
    gen = torch.Generator().manual_seed(0)
    layers = [{} for _ in range(4)]
    shapes = {"self_attn.q_proj": (512, 512), "self_attn.k_proj": (512, 512), "self_attn.v_proj": (512, 512),
              "self_attn.o_proj": (512, 512), "mlp.gate_proj": (1408, 512), "mlp.up_proj": (1408, 512),
              "mlp.down_proj": (512, 1408)}
    for i in range(8):
        shard = layers[i // 2]
        for mod, shape in shapes.items():
            shard[f"model.layers.{i}.{mod}.weight"] = torch.randn(shape, generator=gen) * 0.02
        shard[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(512)
        shard[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(512)
    layers[0]["model.embed_tokens.weight"] = torch.randn(512, 512, generator=gen)
    layers[3]["model.norm.weight"] = torch.ones(512)
    layers[3]["lm_head.weight"] = torch.randn(512, 512, generator=gen)
    ext, key = (".safetensors", "model.safetensors.index.json") if fmt == "safetensors" else (".bin", "pytorch_model.bin.index.json")
    stem = "model" if fmt == "safetensors" else "pytorch_model"
    weight_map = {}
    for i, shard in enumerate(layers):
        fname = f"{stem}-{i + 1:05d}-of-00004{ext}"
        save_file(shard, str(d / fname)) if fmt == "safetensors" else torch.save(shard, d / fname)
        weight_map.update(dict.fromkeys(shard, fname))
    (d / key).write_text(json.dumps({"weight_map": weight_map}))
    shard_bytes = max(sum(t.numel() * 4 for t in s.values()) for s in layers)
    tensor_bytes = max(t.numel() * 4 for s in layers for t in s.values())

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(d), fmt], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    print(f"\n{fmt}: checkpoint {r['model'] / mib:.0f} MiB in 4 shards of <= {shard_bytes / mib:.0f} MiB; "
          f"peak host memory growth while loading {r['growth'] / mib:.1f} MiB")
    assert r["growth"] <= shard_bytes + tensor_bytes + 24 * mib
    assert r["growth"] < r["model"] * 0.6  # far from holding the whole checkpoint at once
    np.testing.assert_array_less(0, r["model"])


def _config_without_rope_scaling(src: str, dst) -> str:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_parameters"]["rope_theta"]}
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_gguf_llama31_rope_freqs_become_the_llama3_config(checkpoints, tmp_path):
    """llama.cpp writes Llama 3.1's RoPE scaling as the rope_freqs tensor only: octavo recovers
    the llama3 parameters (computing RoPE as transformers does) and matches the safetensors."""
    src = checkpoints["llama31"]
    llm = LLM(str(write_gguf(src, tmp_path / "l31.gguf", "F32")), dtype="float32")
    rope = llm.llm_engine.config.model_config.hf_config.rope_parameters
    expected = json.loads(open(os.path.join(src, "config.json")).read())["rope_parameters"]
    assert {k: rope[k] for k in expected} == expected
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == _greedy(src)
    # The fixture exercises the scaling: the same weights without it answer differently.
    plain = write_gguf(_config_without_rope_scaling(src, tmp_path / "plain"), tmp_path / "plain.gguf", "F32")
    outs = LLM(str(plain), dtype="float32").generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] != _greedy(src)


def test_gguf_rope_freqs_applied_directly_when_not_recoverable(checkpoints, tmp_path):
    """A 16-wide head has one frequency in llama3's smoothing band: the parameters are not
    determined, so each frequency is divided by its stored factor (as llama.cpp does)."""
    src = checkpoints["llama"]
    llm = LLM(str(write_gguf(src, tmp_path / "l3.gguf", "F32")), dtype="float32")
    rope = llm.llm_engine.config.model_config.hf_config.rope_parameters
    assert rope["rope_type"] == "default" and len(rope["gguf_freq_factors"]) == 8
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == _greedy(src)


def test_gguf_rope_freqs_of_the_wrong_length_is_refused(checkpoints, tmp_path):
    import gguf

    from tests.fixtures import gguf_writer

    real = gguf_writer.llama3_rope_freqs
    try:
        gguf_writer.llama3_rope_freqs = lambda rope, dim: np.ones(dim, dtype=np.float32)
        path = write_gguf(checkpoints["llama"], tmp_path / "bad.gguf", "F32")
    finally:
        gguf_writer.llama3_rope_freqs = real
    assert any(t.name == "rope_freqs.weight" for t in gguf.GGUFReader(str(path)).tensors)
    with pytest.raises(ValueError, match="rope_freqs.weight has 16 factors; the model rotates 16 dimensions and needs 8"):
        LLM(str(path), dtype="float32")
