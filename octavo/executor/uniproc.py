"""One worker in the engine process."""

from __future__ import annotations

from octavo.config import OctavoConfig
from octavo.executor.abstract import Executor
from octavo.worker.worker import Worker


class UniProcExecutor(Executor):
    supports_async_scheduling = True

    def __init__(self, config: OctavoConfig) -> None:
        self.worker = Worker(config)
        info = self.worker.info()
        self.worker_infos = (info,)
        self.attn_backend_name = info["attn_backend"]
        self.model_bytes = info["model_bytes"]
        self.load_seconds = info["load_seconds"]

    @property
    def runner(self):
        return self.worker.runner

    def determine_num_blocks(self) -> int:
        return self.worker.determine_num_blocks()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.worker.initialize_kv_cache(num_blocks)

    def execute_model(self, so):
        return self.worker.execute_model(so)

    def propose_drafts(self, num_drafts):
        return self.worker.propose_drafts(num_drafts)

    def execute_model_async(self, so):
        return self.worker.runner.execute_model_async(so)
