"""One spawned worker process per device; the driver never joins a collective.

Each step the driver sends the msgpack-encoded ``SchedulerOutput`` to every worker over a
pipe and waits for all replies (rank 0's carries the sampled tokens, the others an ack),
watching the worker processes' sentinels at the same time: a worker that dies makes the
driver raise ``WorkerDiedError`` within a poll interval instead of hanging.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import traceback
from multiprocessing.connection import Connection, wait

from octavo.config import OctavoConfig
from octavo.engine import serial
from octavo.executor import messages
from octavo.executor.abstract import DistributedExecutor, WorkerDiedError
from octavo.spec_decode.config import speculative_config_dict

logger = logging.getLogger(__name__)

POLL_S = 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_main(config_args: dict, rank: int, init_method: str, conn: Connection) -> None:
    """Entry point of a worker process: build the worker, then serve calls until shutdown."""
    try:
        from octavo.engine.arg_utils import EngineArgs
        from octavo.logger import configure_logging
        from octavo.worker.worker import Worker

        configure_logging()
        config = EngineArgs(**config_args).create_engine_config()
        worker = Worker(config, rank=rank, local_rank=rank, init_method=init_method)
        conn.send_bytes(serial.pack("ok", worker.info()))
    except BaseException as e:  # report, then exit: the driver raises
        conn.send_bytes(serial.pack("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    while True:
        try:
            method, arg = serial.unpack(conn.recv_bytes())
        except EOFError:
            return
        try:
            if method == "shutdown":
                worker.shutdown()
                conn.send_bytes(serial.pack("ok", None))
                return
            result = messages.handle_call(worker, method, arg)
            conn.send_bytes(serial.pack("ok", result))
        except BaseException as e:
            conn.send_bytes(serial.pack("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def engine_args_dict(config: OctavoConfig) -> dict:
    """Rebuild the EngineArgs that produce ``config`` (workers re-derive it themselves)."""
    mc, cc, sc, pc = config.model_config, config.cache_config, config.scheduler_config, config.parallel_config
    return dict(
        model=mc.model, tokenizer=mc.tokenizer, dtype=str(mc.dtype).removeprefix("torch."),
        max_model_len=mc.max_model_len, seed=mc.seed, load_format=mc.load_format,
        block_size=cc.block_size, enable_prefix_caching=cc.enable_prefix_caching,
        num_gpu_blocks_override=cc.num_gpu_blocks_override,
        gpu_memory_utilization=cc.gpu_memory_utilization, kv_cache_dtype=cc.kv_cache_dtype,
        max_num_batched_tokens=sc.max_num_batched_tokens, max_num_seqs=sc.max_num_seqs,
        scheduling_policy=sc.policy, long_prefill_token_threshold=sc.long_prefill_token_threshold,
        enable_chunked_prefill=sc.enable_chunked_prefill,
        tensor_parallel_size=pc.tensor_parallel_size,
        distributed_executor_backend=pc.distributed_executor_backend,
        enable_expert_parallel=pc.enable_expert_parallel,
        enforce_eager=config.enforce_eager,
        quantization=mc.quantization, prefix_caching_hash_algo=cc.prefix_caching_hash_algo,
        model_impl=mc.model_impl,
        speculative_config=speculative_config_dict(config.speculative_config),
    )


# EngineArgs fields a worker does not need: the engine core (rank 0's process) alone serves,
# schedules, samples and detokenizes; a worker only loads its shard and runs forward passes.
# tests/executor checks that every other field is forwarded, so a new flag cannot be dropped.
ENGINE_ONLY_FIELDS = frozenset({
    "revision", "tokenizer_revision", "download_dir",  # the model is already a local folder here
    "served_model_name", "trust_remote_code", "pipeline_parallel_size", "async_scheduling",
    "generation_config", "structured_outputs_config", "guided_decoding_backend", "reasoning_parser",
})


# Tries at a fresh loopback port: the port is free when chosen, but rank 0 binds it only after
# spawning and importing torch, and another process (other engines' collective connections,
# on ephemeral ports) may take it in between.
RENDEZVOUS_TRIES = 3


class MultiprocExecutor(DistributedExecutor):
    def __init__(self, config: OctavoConfig) -> None:
        world = config.parallel_config.tensor_parallel_size
        chosen = os.environ.get("OCTAVO_DIST_INIT_METHOD")
        args = engine_args_dict(config)
        for attempt in range(1, RENDEZVOUS_TRIES + 1):
            init_method = chosen or f"tcp://127.0.0.1:{_free_port()}"
            try:
                infos = self._start(world, init_method, args)
                break
            except WorkerDiedError as e:
                if chosen or attempt == RENDEZVOUS_TRIES or "EADDRINUSE" not in str(e):
                    raise
                logger.warning("rendezvous port of %s was taken before the workers bound it (try %d of %d); "
                               "starting them again on another", init_method, attempt, RENDEZVOUS_TRIES)
        self.worker_infos = tuple(infos)
        self.attn_backend_name = infos[0]["attn_backend"]
        self.model_bytes = sum(i["model_bytes"] for i in infos)
        self.load_seconds = max(i["load_seconds"] for i in infos)
        logger.info("started %d tensor-parallel workers (%s)", world, init_method)

    def _start(self, world: int, init_method: str, args: dict) -> list:
        """Spawn one worker per rank on ``init_method``; their infos once all are built."""
        ctx = mp.get_context("spawn")
        self.procs: list[mp.Process] = []
        self.conns: list[Connection] = []
        for rank in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(args, rank, init_method, child), daemon=True, name=f"octavo-worker-{rank}")
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        return self._collect(timeout=None)

    def _collect(self, timeout: float | None) -> list:
        """Wait for one reply per worker; raise if a worker errors or dies."""
        pending = dict(enumerate(self.conns))
        results: list = [None] * len(self.conns)
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.procs)}
        while pending:
            ready = wait(list(pending.values()) + list(sentinels), timeout=POLL_S)
            for obj in ready:
                if obj in sentinels:
                    rank = sentinels.pop(obj)
                    if rank in pending and not self.conns[rank].poll():
                        self._fail(f"tensor-parallel worker {rank} died (exit code {self.procs[rank].exitcode})")
                    continue
                rank = next(r for r, c in pending.items() if c is obj)
                try:
                    status, value = serial.unpack(obj.recv_bytes())
                except (EOFError, OSError):
                    self._fail(f"tensor-parallel worker {rank} closed its pipe{self._dead_workers()}")
                if status == "error":
                    self._fail(f"tensor-parallel worker {rank} failed: {value}")
                results[rank] = value
                del pending[rank]
        return results

    def _dead_workers(self) -> str:
        """'; dead: worker R (exit code C), ...' — signal-killed first: when one worker dies,
        its peers fail in the collective right after, and the first death is the cause."""
        for p in self.procs:
            p.join(timeout=0.5)
        dead = [(r, p.exitcode) for r, p in enumerate(self.procs) if p.exitcode is not None]
        dead.sort(key=lambda d: (d[1] >= 0, d[0]))
        return ("; dead: " + ", ".join(f"worker {r} (exit code {c})" for r, c in dead)) if dead else ""

    def _fail(self, msg: str) -> None:
        logger.error(msg)
        self.shutdown(graceful=False)
        raise WorkerDiedError(msg)

    def _call(self, method: str, arg=None) -> list:
        data = serial.pack(method, arg)
        for rank, c in enumerate(self.conns):
            try:
                c.send_bytes(data)
            except (BrokenPipeError, OSError):
                self._fail(f"tensor-parallel worker {rank} is gone (exit code {self.procs[rank].exitcode})")
        return self._collect(timeout=None)

    def check_health(self) -> None:
        for rank, p in enumerate(self.procs):
            if not p.is_alive():
                raise WorkerDiedError(f"tensor-parallel worker {rank} died (exit code {p.exitcode})")

    def shutdown(self, graceful: bool = True) -> None:
        procs, self.procs = getattr(self, "procs", []), []
        if graceful:
            for c, p in zip(self.conns, procs, strict=False):
                if p.is_alive():
                    try:
                        c.send_bytes(serial.pack("shutdown", None))
                    except OSError:
                        pass
        for p in procs:
            p.join(timeout=5 if graceful else 0.5)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        for c in self.conns:
            c.close()
        self.conns = []

    def __del__(self):
        try:
            self.shutdown(graceful=False)
        except Exception:
            pass
