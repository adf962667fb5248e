"""The multiprocess executor's workers as Ray actors, so a model can span nodes.

One actor per device inside a placement group (one GPU per bundle on accelerators, one CPU
otherwise). Calls fan out to every actor; rank 0's result is the step's output. A dead actor
surfaces as ``WorkerDiedError``.
"""

from __future__ import annotations

import logging
import os

from octavo.config import OctavoConfig
from octavo.engine import serial
from octavo.executor import messages
from octavo.executor.abstract import DistributedExecutor, WorkerDiedError
from octavo.executor.multiproc import _free_port, engine_args_dict

logger = logging.getLogger(__name__)


class _RayWorker:
    """Actor body: builds a ``Worker`` from plain engine args (no pickled config objects)."""

    def __init__(self, config_args: dict, rank: int, init_method: str) -> None:
        from octavo.engine.arg_utils import EngineArgs
        from octavo.worker.worker import Worker

        config = EngineArgs(**config_args).create_engine_config()
        # Ray restricts each actor to its own device, which it sees as index 0.
        self.worker = Worker(config, rank=rank, local_rank=0, init_method=init_method)

    def call(self, data: bytes) -> bytes:
        method, arg = serial.unpack(data)
        return serial.encode(messages.handle_call(self.worker, method, arg))


class RayExecutor(DistributedExecutor):
    def __init__(self, config: OctavoConfig) -> None:
        try:
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as e:
            raise ValueError(
                "--distributed-executor-backend ray needs the 'ray' package (pip install ray)"
            ) from e
        from octavo.platforms import current_platform

        self.ray = ray
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
        world = config.parallel_config.tensor_parallel_size
        on_gpu = not current_platform.device_is_host()
        bundle = {"GPU": 1, "CPU": 1} if on_gpu else {"CPU": 1}
        self.pg = placement_group([bundle] * world, strategy="PACK")
        ray.get(self.pg.ready(), timeout=120)
        host = "127.0.0.1" if not on_gpu else ray.util.get_node_ip_address()
        init_method = f"tcp://{host}:{_free_port()}"
        args = engine_args_dict(config)
        actor_cls = ray.remote(num_cpus=1, num_gpus=1 if on_gpu else 0)(_RayWorker)
        self.actors = [
            actor_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=rank
                ),
                # Every rank reads the driver's OCTAVO_* settings (graph modes, kernels): ranks
                # that chose differently would run differently shaped collectives and hang.
                runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("OCTAVO_")}},
            ).remote(args, rank, init_method)
            for rank in range(world)
        ]
        infos = self._call("info")
        self.worker_infos = tuple(infos)
        self.attn_backend_name = infos[0]["attn_backend"]
        self.model_bytes = sum(i["model_bytes"] for i in infos)
        self.load_seconds = max(i["load_seconds"] for i in infos)

    def _call(self, method: str, arg=None) -> list:
        data = serial.pack(method, arg)
        refs = [a.call.remote(data) for a in self.actors]
        try:
            return [serial.decode(b) for b in self.ray.get(refs)]
        except self.ray.exceptions.RayActorError as e:
            self.shutdown()
            raise WorkerDiedError(f"a Ray tensor-parallel worker died: {e}") from e
        except self.ray.exceptions.RayTaskError as e:
            raise WorkerDiedError(f"a Ray tensor-parallel worker failed: {e}") from e

    def shutdown(self) -> None:
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a)
            except Exception:
                pass
        self.actors = []
        pg = getattr(self, "pg", None)
        if pg is not None:
            try:
                self.ray.util.remove_placement_group(pg)
            except Exception:
                pass
            self.pg = None
