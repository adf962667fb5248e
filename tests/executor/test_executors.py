"""The in-process and the multiprocess executor run the same steps to the same tokens, and a
worker's failure reaches the driver as an error naming the worker and the cause."""

from __future__ import annotations

import pytest

from octavo.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from octavo.engine.arg_utils import EngineArgs
from octavo.executor.abstract import WorkerDiedError
from octavo.executor.multiproc import MultiprocExecutor
from octavo.executor.uniproc import UniProcExecutor
from octavo.platforms import use_platform
from octavo.platforms.cpu import CpuPlatform
from octavo.sampling_params import SamplingParams


def _config(llama_dir):
    return EngineArgs(model=llama_dir, dtype="float32", max_model_len=64, num_gpu_blocks_override=16).create_engine_config()


def _run_steps(executor, n_steps=4):
    """Prefill a 5-token prompt, then decode greedily, feeding each sampled token back."""
    assert executor.determine_num_blocks() == 16
    executor.initialize_kv_cache(16)
    params = SamplingParams(temperature=0, max_tokens=n_steps)
    out = executor.execute_model(SchedulerOutput(
        [NewRequestData("r", [5, 6, 7, 8, 9], [], params, [[1]], 0)], [], {"r": 5}, 5))
    tokens = [out.sampled_token_ids[0][0]]
    for i in range(1, n_steps):
        so = SchedulerOutput([], [CachedRequestData("r", [[]], 4 + i)], {"r": 1}, 1)
        tokens.append(executor.execute_model(so).sampled_token_ids[0][0])
    return tokens


@pytest.fixture
def cpu():
    with use_platform(CpuPlatform):
        yield


@pytest.mark.usefixtures("cpu")
def test_uniproc_and_multiproc_agree(llama_dir):
    config = _config(llama_dir)
    uni = UniProcExecutor(config)
    try:
        expected = _run_steps(uni)
    finally:
        uni.shutdown()
    mp = MultiprocExecutor(config.replace())
    try:
        assert mp.attn_backend_name == uni.attn_backend_name and mp.model_bytes == uni.model_bytes
        assert _run_steps(mp) == expected
        mp.check_health()
    finally:
        mp.shutdown()
    assert len(expected) == 4


@pytest.mark.usefixtures("cpu")
def test_worker_error_is_raised_with_its_cause(llama_dir):
    mp = MultiprocExecutor(_config(llama_dir))
    try:
        with pytest.raises(WorkerDiedError, match=r"worker 0 failed: ValueError: unknown worker method 'nope'"):
            mp._call("nope")
        assert mp.procs == []  # a failed executor shut its workers down
    finally:
        mp.shutdown()


def test_workers_get_every_engine_flag_they_need():
    """A worker rebuilds its config from ``engine_args_dict``: an EngineArgs field that is neither
    forwarded nor declared engine-only would be silently dropped on tensor-parallel ranks."""
    import dataclasses

    from octavo.engine.arg_utils import EngineArgs
    from octavo.executor.multiproc import ENGINE_ONLY_FIELDS, engine_args_dict

    config = EngineArgs(tensor_parallel_size=1).create_engine_config()
    forwarded = set(engine_args_dict(config))
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert forwarded <= fields
    assert fields - forwarded - ENGINE_ONLY_FIELDS == set()


@pytest.mark.usefixtures("cpu")
def test_taken_rendezvous_port_is_retried_on_another(llama_dir, monkeypatch):
    """The loopback port chosen for the workers' rendezvous is taken before rank 0 binds it (a
    real listening socket holds it here): the workers fail with EADDRINUSE and the executor
    starts them again on another port instead of failing the engine."""
    import socket

    from octavo.executor import multiproc

    held = socket.socket()
    held.bind(("0.0.0.0", 0))  # every IPv4 address: the store's listen on any address fails
    held.listen()
    real, chosen = multiproc._free_port, []
    monkeypatch.setattr(multiproc, "_free_port",
                        lambda: chosen.append(held.getsockname()[1] if not chosen else real()) or chosen[-1])
    try:
        config = EngineArgs(model=llama_dir, dtype="float32", max_model_len=64, num_gpu_blocks_override=16,
                            tensor_parallel_size=2).create_engine_config()
        mp = MultiprocExecutor(config)
        try:
            assert len(_run_steps(mp)) == 4
            assert len(chosen) == 2 and chosen[0] == held.getsockname()[1] != chosen[1]
        finally:
            mp.shutdown()
    finally:
        held.close()
