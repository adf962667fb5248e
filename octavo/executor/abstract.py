"""The executor contract the engine core programs against."""

from __future__ import annotations

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput


class WorkerDiedError(RuntimeError):
    """A worker process or actor is gone; the engine cannot continue."""


class Executor:
    attn_backend_name: str = "?"
    model_bytes: int = 0
    worker_infos: tuple[dict, ...] = ()  # Worker.info() of every rank, rank order
    load_seconds: float = 0.0  # weight loading, slowest worker
    # Launching a step returns before the device finishes it (async scheduling overlaps the
    # host work of the next step with it).
    supports_async_scheduling: bool = False

    def determine_num_blocks(self) -> int:
        raise NotImplementedError

    def initialize_kv_cache(self, num_blocks: int) -> None:
        raise NotImplementedError

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        raise NotImplementedError

    def execute_model_async(self, so: SchedulerOutput):
        """Launch a step; ``.result()`` on the returned handle gives its ``ModelRunnerOutput``."""
        from octavo.worker.step_handle import ReadyStep

        return ReadyStep(self.execute_model(so))

    def propose_drafts(self, num_drafts: dict[str, int]) -> dict[str, list[int]]:
        """Draft-model proposals: up to ``num_drafts[req_id]`` drafts per request."""
        raise NotImplementedError

    def check_health(self) -> None:
        """Raise ``WorkerDiedError`` if any worker is gone."""

    def shutdown(self) -> None:
        pass


class DistributedExecutor(Executor):
    """Executors that fan each call out to every worker; rank 0's reply is the result.

    Subclasses implement ``_call(method, arg) -> list`` (one decoded reply per rank).
    """

    def _call(self, method: str, arg=None) -> list:
        raise NotImplementedError

    def determine_num_blocks(self) -> int:
        return min(self._call("determine_num_blocks"))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._call("initialize_kv_cache", num_blocks)

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        from octavo.engine import serial

        out = self._call("execute_model", serial.encode_scheduler_output(so))[0]
        return serial.decode_runner_output(out)

    def propose_drafts(self, num_drafts: dict[str, int]) -> dict[str, list[int]]:
        return self._call("propose_drafts", num_drafts)[0]
