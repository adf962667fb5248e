"""The CLI on the shipped model: ``octavo generate`` with no flags, ``octavo info``."""

import subprocess
import sys

import pytest

from octavo.engine.model_files import DEFAULT_MODEL_DIR

needs_default = pytest.mark.skipif(
    not (DEFAULT_MODEL_DIR / "model.safetensors").exists(), reason="shipped model missing"
)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "octavo.entrypoints.cli", *args],
        capture_output=True, text=True, timeout=600,
    )


@needs_default
def test_generate_with_no_flags_uses_shipped_model():
    r = run_cli("generate", "def fibonacci(n):")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def fibonacci(n):")
    assert len(r.stdout.strip()) > len("def fibonacci(n):") + 10


@needs_default
def test_info_reports_platform_and_backend():
    r = run_cli("info")
    assert r.returncode == 0, r.stderr
    assert "platform" in r.stdout and "cpu" in r.stdout
    assert "attention" in r.stdout


def test_generate_bad_model_is_a_clear_error(tmp_path):
    r = run_cli("generate", "x", "--model", str(tmp_path / "nope"))
    assert r.returncode == 2
    assert "error:" in r.stderr and "model" in r.stderr


def test_info_models_lists_the_registry_with_features():
    """``octavo info --models`` is generated from the registry and the classes' declarations."""
    from octavo.models.registry import describe_models, supported_architectures

    r = run_cli("info", "--models")
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("\n\n")[0].strip().splitlines()
    assert table[0].split() == ["architecture", "experts", "sliding", "window", "tensor", "parallel",
                                "quantization", "formats"]
    rows = {line.split()[0]: line for line in table[1:]}
    assert sorted(rows) == supported_architectures()
    for m in describe_models():
        cells = rows[m.architecture].split(None, 4)
        assert cells[1] == ("MoE" if m.mixture_of_experts else "dense")
        assert cells[2] == ("yes" if m.sliding_window else "no")
        assert cells[3] == ("yes" if m.tensor_parallel else "no")
        assert cells[4].endswith(", ".join(m.formats))
    assert "gguf" in rows["LlamaForCausalLM"] and "gguf" not in rows["Gemma2ForCausalLM"]
    assert {"Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM"} <= set(rows)
    assert "--enable-expert-parallel" in r.stdout
