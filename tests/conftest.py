"""Shared fixtures: tiny checkpoints per architecture, built once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OCTAVO_CPU_KVCACHE_SPACE", "0.25")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
MOE_ARCHS = ["mixtral", "qwen2_moe", "qwen3_moe"]


@pytest.fixture
def cpu_platform(monkeypatch):
    """Force the CPU platform for a test that means CPU (it would pick CUDA on a GPU machine).

    Set in the environment, so worker processes the test spawns resolve CPU too.
    """
    from octavo.platforms import reset_current_platform

    monkeypatch.setenv("OCTAVO_PLATFORM", "cpu")
    reset_current_platform()
    yield
    reset_current_platform()  # re-resolved lazily, after monkeypatch restores the environment


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from tests.fixtures.checkpoints import build_tokenizer

    d = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(d)
    return d


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, tokenizer_dir):
    """arch -> folder of a tiny float32 checkpoint (built lazily, once)."""
    from tests.fixtures.checkpoints import build_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    cache: dict[str, str] = {}

    class _Lazy(dict):
        def __getitem__(self, arch):
            if arch not in cache:
                cache[arch] = str(build_checkpoint(arch, root / arch, tokenizer_dir))
            return cache[arch]

    return _Lazy()


@pytest.fixture(scope="session")
def llama_dir(checkpoints):
    return checkpoints["llama"]
