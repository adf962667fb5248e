"""Tensor parallelism on the CPU with gloo: TP=2 greedy outputs equal TP=1.

Includes an architecture where num_kv_heads < tp (mistral fixture: 1 KV head, replicated).
"""

import os
import signal
import threading
import time

import pytest

from octavo import LLM, SamplingParams
from octavo.executor.abstract import WorkerDiedError
from tests.conftest import ARCHS
from tests.hf_reference import random_prompts

LENGTHS = [1, 17, 40, 90]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8)


def _generate(path: str, tp: int, backend: str = "mp") -> list[list[int]]:
    llm = LLM(path, dtype="float32", tensor_parallel_size=tp, distributed_executor_backend=backend,
              max_num_batched_tokens=64, max_num_seqs=3)
    vocab = llm.llm_engine.config.model_config.vocab_size
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, LENGTHS, seed=5)]
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


# Plus the architectures with their own layers: Gemma (norms, GeGLU, soft caps, q/k norm),
# Phi-3 (fused checkpoint tensors split before the rank slices them).
@pytest.mark.parametrize("arch", [*ARCHS, "gemma2", "gemma3", "phi3_partial"])
@pytest.mark.usefixtures("cpu_platform")  # gloo on CPU: 2 workers, on any machine
def test_tp2_matches_tp1(arch, checkpoints):
    path = checkpoints[arch]
    assert _generate(path, 2) == _generate(path, 1)


@pytest.mark.usefixtures("cpu_platform")
def test_worker_death_fails_requests_quickly(llama_dir):
    llm = LLM(llama_dir, dtype="float32", tensor_parallel_size=2)
    executor = llm.llm_engine.core.executor
    victim = executor.procs[1]
    stepping = threading.Event()
    execute_model = executor.execute_model

    def execute_and_signal(so):  # the kill lands while steps are running, not before
        out = execute_model(so)
        stepping.set()
        return out

    executor.execute_model = execute_and_signal

    def kill_once_stepping():
        if stepping.wait(timeout=120):
            os.kill(victim.pid, signal.SIGKILL)

    threading.Thread(target=kill_once_stepping, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError, match="worker 1"):
        llm.generate([{"prompt_token_ids": [5] * 20}] * 4, SamplingParams(max_tokens=2000, ignore_eos=True, temperature=0), use_tqdm=False)
    assert time.monotonic() - t0 < 30
    llm.shutdown()


@pytest.mark.ray
@pytest.mark.usefixtures("cpu_platform")
def test_ray_backend_tp2_matches_tp1(llama_dir):
    ray = pytest.importorskip("ray")
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        assert _generate(llama_dir, 2, backend="ray") == _generate(llama_dir, 1)
    finally:
        ray.shutdown()


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_tp2_matches_tp1_on_two_gpus(arch, checkpoints):
    """NCCL through the CUDA platform's communicator; fp32 so greedy tokens must agree."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    path = checkpoints[arch]
    assert _generate(path, 2) == _generate(path, 1)
