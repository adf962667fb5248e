"""Executors run the model on one or more workers and hand back rank 0's output.

``uniproc`` (one device, in-process), ``mp`` (one spawned process per device, the default for
``tensor_parallel_size > 1``), ``ray`` (the same workers as Ray actors, possibly across nodes).
"""

from __future__ import annotations

from octavo.config import OctavoConfig
from octavo.executor.abstract import Executor


def create_executor(config: OctavoConfig) -> Executor:
    pc = config.parallel_config
    if pc.tensor_parallel_size == 1 and pc.distributed_executor_backend != "ray":
        from octavo.executor.uniproc import UniProcExecutor

        return UniProcExecutor(config)
    if pc.distributed_executor_backend == "ray":
        from octavo.executor.ray_executor import RayExecutor

        return RayExecutor(config)
    from octavo.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(config)
