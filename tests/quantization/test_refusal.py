"""A checkpoint or flag asking for quantization octavo cannot honour is refused at load.

The checkpoints here are real safetensors folders: the tiny Llama fixture rewritten with
an FP8 ``compressed-tensors`` layout (float8 weights plus ``weight_scale`` tensors), as the
checkpoints users bring look on disk. Before quantization support existed such a checkpoint
loaded "fine" and generated garbage; now it runs (tests/quantization/test_activation_formats.py)
and every setting octavo cannot honour is refused with the setting named.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo import LLM
from octavo.quantization import resolve_quantization

COMPRESSED_FP8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}


def _fp8_checkpoint(src, dst, quant_config):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if name.endswith("proj.weight"):
            scale = t.abs().amax(dim=1, keepdim=True).float() / 448.0
            out[name] = (t.float() / scale).to(torch.float8_e4m3fn)
            out[name.removesuffix("weight") + "weight_scale"] = scale
        else:
            out[name] = t
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    if quant_config is None:
        cfg.pop("quantization_config", None)
    else:
        cfg["quantization_config"] = quant_config
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_compressed_tensors_fp8_checkpoint_loads_with_its_scales(llama_dir, tmp_path):
    from octavo import SamplingParams

    d = _fp8_checkpoint(llama_dir, tmp_path / "fp8", COMPRESSED_FP8)
    out = LLM(str(d), dtype="float32").generate(
        [{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize(
    "change, pattern",
    [
        (lambda g: g["weights"].update(num_bits=4, type="int"), r"scheme weights int4 channel symmetric, activations float8"),
        (lambda g: g["weights"].update(actorder="group"), r"actorder 'group' is not supported"),
        (lambda g: g["weights"].update(my_knob=1), r"unsupported quantization_config keys \['my_knob'\]"),
        (lambda g: g.update(output_activations={"num_bits": 8}), r"output_activations quantization is not supported"),
    ],
)
def test_unsupported_compressed_tensors_scheme_is_refused(llama_dir, tmp_path, change, pattern):
    qc = json.loads(json.dumps(COMPRESSED_FP8))
    change(qc["config_groups"]["group_0"])
    d = _fp8_checkpoint(llama_dir, tmp_path / "fp8", qc)
    with pytest.raises(ValueError, match=pattern):
        LLM(str(d))


@pytest.mark.parametrize("scheme", [{"num_bits": 8, "type": "float", "strategy": "channel"},
                                    {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": True},
                                    {"num_bits": 8, "type": "int", "strategy": "tensor"}])
def test_compressed_tensors_kv_cache_schemes_other_than_static_fp8_are_refused(llama_dir, tmp_path, scheme):
    d = _fp8_checkpoint(llama_dir, tmp_path / "fp8", dict(COMPRESSED_FP8, kv_cache_scheme=scheme))
    with pytest.raises(ValueError, match=r"compressed-tensors: kv_cache_scheme .* is not supported"):
        LLM(str(d))


def test_declared_kv_cache_scales_must_be_there(llama_dir, tmp_path):
    qc = dict(COMPRESSED_FP8, kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "tensor"})
    d = _fp8_checkpoint(llama_dir, tmp_path / "fp8", qc)
    with pytest.raises(ValueError, match=r"KV cache scales .* missing for the attention layers \[0, 1\]"):
        LLM(str(d))


def test_scales_without_quantization_config_are_not_dropped(llama_dir, tmp_path):
    d = _fp8_checkpoint(llama_dir, tmp_path / "fp8-noconfig", None)
    with pytest.raises(ValueError, match=r"tensors octavo's .* does not use.*weight_scale"):
        LLM(str(d))


@pytest.mark.parametrize(
    "qcfg, pattern",
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, r"'bitsandbytes' \(a vLLM method octavo does not implement yet\)"),
        ({"quant_method": "my-magic-quant"}, r"'my-magic-quant'; octavo supports"),
        ({"bits": 4, "group_size": 128}, r"names no quant_method \(keys: bits, group_size\)"),
    ],
)
def test_quantization_config_refused_with_method_named(llama_dir, tmp_path, qcfg, pattern):
    d = tmp_path / "q"
    shutil.copytree(llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=pattern):
        LLM(str(d))


def test_quantization_flag_is_refused_not_ignored(llama_dir, cpu_platform):
    with pytest.raises(ValueError, match=r"--quantization \(quantization\) 'fp8' on an unquantized checkpoint"):
        LLM(llama_dir, quantization="fp8")
    with pytest.raises(ValueError, match=r"'marlin' \(a vLLM method octavo does not implement yet\)"):
        LLM(llama_dir, quantization="marlin")


def test_method_known_but_not_on_this_platform():
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    with pytest.raises(ValueError, match=r"'fp8', which the tpu platform cannot run; supported here: none"):
        resolve_quantization(None, fp8, "tpu", ())
    assert resolve_quantization(None, fp8, "cuda", ("fp8",)) == "fp8"
    with pytest.raises(ValueError, match="does not match the checkpoint"):
        resolve_quantization("awq", fp8, "cuda", ("fp8", "awq"))
    with pytest.raises(ValueError, match=r"fp8: activation_scheme 'sometimes' is not supported"):
        resolve_quantization(None, dict(fp8, activation_scheme="sometimes"), "cuda", ("fp8",))


def test_platform_without_quantization_refuses_a_quantized_checkpoint(llama_dir, tmp_path, cpu_platform, monkeypatch):
    """The platform layer's list decides: a CPU that listed no methods refuses the checkpoint."""
    from octavo.platforms.cpu import CpuPlatform

    monkeypatch.setattr(CpuPlatform, "supported_quantization", ())
    d = _fp8_checkpoint(llama_dir, tmp_path / "fp8", COMPRESSED_FP8)
    with pytest.raises(ValueError, match=r"'compressed-tensors', which the cpu platform cannot run; supported here: none"):
        LLM(str(d))
