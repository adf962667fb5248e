"""The executor contract the engine core programs against."""

from __future__ import annotations

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput


class WorkerDiedError(RuntimeError):
    """A worker process or actor is gone; the engine cannot continue."""


class Executor:
    attn_backend_name: str = "?"
    model_bytes: int = 0

    def determine_num_blocks(self) -> int:
        raise NotImplementedError

    def initialize_kv_cache(self, num_blocks: int) -> None:
        raise NotImplementedError

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        raise NotImplementedError

    def check_health(self) -> None:
        """Raise ``WorkerDiedError`` if any worker is gone."""

    def shutdown(self) -> None:
        pass
