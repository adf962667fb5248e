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


# -- help without torch, flags from EngineArgs ----------------------------------------------
@pytest.mark.parametrize("command", [[], ["serve"], ["generate"], ["bench", "serve"], ["bench", "throughput"]])
def test_help_never_imports_torch(command):
    code = (
        "import sys\nfrom octavo.entrypoints.cli import main\n"
        f"try:\n    main({[*command, '--help']!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "print('heavy:', heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("heavy: []"), r.stdout[-500:]
    assert "usage: octavo" in r.stdout


def test_engine_flags_are_engine_args_fields_with_help():
    import dataclasses

    from octavo.engine.arg_utils import EngineArgs
    from octavo.entrypoints.engine_cli import engine_fields

    parsed = {f.name: f for f in engine_fields()}
    real = {f.name: f for f in dataclasses.fields(EngineArgs)}
    assert list(parsed) == list(real)
    for name, f in real.items():
        assert parsed[name].default == f.default, name
        assert len(parsed[name].help) > 10, f"EngineArgs.{name} has no docstring (its --help text)"


def test_cli_flags_parse_to_engine_args():
    from octavo.engine.arg_utils import EngineArgs
    from octavo.entrypoints.cli import build_parser
    from octavo.entrypoints.engine_cli import resolve_model_arg

    args = build_parser().parse_args(
        ["serve", "--model", "m", "--served-model-name", "a", "b", "-tp", "2", "--no-enable-prefix-caching",
         "--enforce-eager", "--max-model-len", "64", "--gpu-memory-utilization", "0.5"])
    resolve_model_arg(args)
    e = EngineArgs.from_cli_args(args)
    assert (e.model, e.served_model_names(), e.tensor_parallel_size) == ("m", ["a", "b"], 2)
    assert (e.enable_prefix_caching, e.enforce_eager, e.max_model_len, e.gpu_memory_utilization) == (False, True, 64, 0.5)
    assert EngineArgs.from_cli_args(build_parser().parse_args(["generate", "x"])) == EngineArgs()
    twice = build_parser().parse_args(["serve", "a", "--model", "b"])
    with pytest.raises(ValueError, match="given twice"):
        resolve_model_arg(twice)


# -- usage errors: one line, exit 2, before any engine starts ----------------------------------
MISSING = "/nonexistent/model"  # a flag error must be reported before the model is even looked at


@pytest.mark.parametrize("argv, needle", [
    (["generate", "x", "--max-tokens", "-5"], "max-tokens"),
    (["generate", "", "--model", MISSING], "prompt 1 of 1 is empty"),
    (["generate", "x", "--temperature", "-1", "--model", MISSING], "temperature"),
    (["generate", "x", "--top-p", "0", "--model", MISSING], "top_p"),
    (["generate", "x", "--tensor-parallel-size", "64", "--model", MISSING], "--tensor-parallel-size 64"),
    (["generate", "x", "--trust-remote-code"], "trust-remote-code"),
    (["serve", MISSING, "--api-key", ""], "--api-key is empty"),
    (["serve", "--model", MISSING, "--port", "0", "-tp", "64"], "--tensor-parallel-size 64"),
])
def test_usage_errors_are_one_line_exit_2(argv, needle):
    r = run_cli(*argv)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    # One error line; the only other lines allowed are log lines (the platform resolution).
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    others = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith(("error:", "INFO "))]
    assert len(errors) == 1 and needle in errors[0] and not others, r.stderr


def test_serve_on_a_busy_port_fails_before_loading():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("serve", MISSING, "--port", str(port))
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: --port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_serve_model_flag_is_accepted(tmp_path):
    r = run_cli("serve", "--model", str(tmp_path / "nope"), "--port", "0")
    assert r.returncode == 2 and "nope" in r.stderr and "unrecognized" not in r.stderr


def test_no_api_key_on_a_public_host_warns(caplog):
    import argparse

    from octavo.entrypoints.preflight import check_api_key

    with caplog.at_level("WARNING"):
        assert check_api_key(argparse.Namespace(api_key=None, host="0.0.0.0"), None) is None
    assert "no API key" in caplog.text and "0.0.0.0" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert check_api_key(argparse.Namespace(api_key=None, host="127.0.0.1"), None) is None
        assert check_api_key(argparse.Namespace(api_key=None, host="0.0.0.0"), "k") == "k"
    assert caplog.text == ""


# -- optional extras ----------------------------------------------------------------------------
@pytest.mark.parametrize("hidden, argv, extra", [
    ("uvicorn", ["serve", "--port", "0"], "serve"),
    ("httpx", ["bench", "serve", "--num-prompts", "1"], "bench"),
    ("ray", ["generate", "x", "--distributed-executor-backend", "ray"], "ray"),
])
def test_missing_extra_is_one_line_naming_the_install(hidden, argv, extra):
    code = (f"import sys\nsys.modules[{hidden!r}] = None  # as if not installed\n"
            f"from octavo.entrypoints.cli import main\nsys.exit(main({argv!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().endswith(f"needs the {extra} extra: pip install 'octavo[{extra}]' (missing: {hidden})")


# -- generate honours generation_config.json like LLM.generate ------------------------------
def test_generate_applies_generation_config_like_llm(llama_dir, tmp_path):
    import json
    import shutil

    from octavo import LLM, SamplingParams

    model = tmp_path / "sampling-model"
    shutil.copytree(llama_dir, model)
    (model / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 1.3, "top_p": 0.95}))
    prompt, common = "def add(a, b):", ["--model", str(model), "--dtype", "float32", "--max-model-len", "128",
                                        "--max-tokens", "24", "--sampling-seed", "7"]
    cli = run_cli("generate", prompt, *common)
    assert cli.returncode == 0, cli.stderr
    greedy = run_cli("generate", prompt, *common, "--temperature", "0")
    llm = LLM(str(model), dtype="float32", max_model_len=128)
    sampled = llm.generate(prompt, SamplingParams(temperature=1.3, top_p=0.95, max_tokens=24, seed=7),
                           use_tqdm=False)[0]
    assert cli.stdout == prompt + sampled.outputs[0].text + "\n"
    assert greedy.stdout != cli.stdout  # the file's temperature is really applied


def test_gpu_memory_utilization_on_cpu_is_not_silently_ignored(caplog):
    import argparse

    from octavo.entrypoints.preflight import warn_ignored
    from octavo.platforms import current_platform

    if not current_platform.device_is_host():
        pytest.skip("CPU policy")
    with caplog.at_level("WARNING"):
        warn_ignored(argparse.Namespace(gpu_memory_utilization=0.9))
    assert caplog.text == ""
    with caplog.at_level("WARNING"):
        warn_ignored(argparse.Namespace(gpu_memory_utilization=0.5))
    assert "--gpu-memory-utilization has no effect on the CPU" in caplog.text


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


def test_cli_choices_match_what_the_builder_accepts():
    """The CLI's choices are literals (no torch import for --help); they must track the builder."""
    from octavo.core.block_hash import HASH_ALGOS
    from octavo.engine.arg_utils import LOAD_FORMATS
    from octavo.entrypoints.engine_cli import CHOICES

    assert CHOICES["load_format"] == list(LOAD_FORMATS)
    assert CHOICES["prefix_caching_hash_algo"] == list(HASH_ALGOS)
