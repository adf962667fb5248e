"""Shared fixtures: tiny checkpoints per architecture, built once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OCTAVO_CPU_KVCACHE_SPACE", "0.25")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
MOE_ARCHS = ["mixtral", "qwen2_moe", "qwen3_moe"]


DEVICE_MARKS = ("cuda", "rocm", "xpu", "tpu")
# A test without a device marker is part of the CPU suite and runs on the CPU platform, also on
# a GPU machine (``nox -s test-cuda`` runs the common tests beside the device ones): everything
# unmarked compares against CPU references (transformers on CPU, ``cpu_paged``, gloo) and must
# not pick the machine's GPU just because one is there. Set for the whole process, so module-
# scoped servers and engines (and the worker processes they spawn) resolve CPU too; tests marked
# for a device lift it (``_device_tests_detect_the_platform``). An explicit OCTAVO_PLATFORM wins.
# The marker variable tells pytest-xdist workers (which inherit the controller's environment,
# this default included) that OCTAVO_PLATFORM=cpu is the suite's default, not the user's choice.
_CPU_BY_DEFAULT = "OCTAVO_PLATFORM" not in os.environ or os.environ.get("OCTAVO_TESTS_CPU_BY_DEFAULT") == "1"
if _CPU_BY_DEFAULT:
    os.environ["OCTAVO_PLATFORM"] = "cpu"
    os.environ["OCTAVO_TESTS_CPU_BY_DEFAULT"] = "1"



def _cpu_slice_for_this_xdist_worker() -> None:
    """Give each pytest-xdist worker its own slice of the machine's CPUs (at least 2: the TP=2
    gloo tests run two ranks).

    Every CPU engine pins one compute thread per core it may run on (``OCTAVO_CPU_THREADS_BIND=
    auto``) and torch sizes its pool to the machine, so N workers on an N-core GPU host would
    each spread over all N cores: N-fold oversubscription. Slices overlap only when there are
    fewer than 2 CPUs per worker; on a 2-core machine nothing changes. Worker processes and
    engine processes a test spawns inherit the mask.
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and count and hasattr(os, "sched_setaffinity")):
        return
    cpus = sorted(os.sched_getaffinity(0))
    per = max(2, len(cpus) // int(count))
    if per >= len(cpus):
        return
    start = (int(worker.removeprefix("gw")) * per) % len(cpus)
    mine = {cpus[(start + i) % len(cpus)] for i in range(per)}
    os.sched_setaffinity(0, mine)
    os.environ.setdefault("OMP_NUM_THREADS", str(per))
    import torch

    torch.set_num_threads(per)


_cpu_slice_for_this_xdist_worker()


@pytest.fixture(autouse=True)
def _device_tests_detect_the_platform(request):
    """Device-marked tests resolve the platform from the hardware, as a user's run would."""
    if not (_CPU_BY_DEFAULT and any(request.node.get_closest_marker(m) for m in DEVICE_MARKS)):
        yield
        return
    from octavo.platforms import reset_current_platform

    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.delenv("OCTAVO_PLATFORM")
    reset_current_platform()
    yield
    reset_current_platform()  # re-resolved lazily, after monkeypatch restores the environment


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
