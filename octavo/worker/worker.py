"""A worker: one device, one rank of the tensor-parallel group, one model runner.

The same class runs in-process (``UniProcExecutor``), in a spawned process
(``MultiprocExecutor``) or as a Ray actor (``RayExecutor``).
"""

from __future__ import annotations

import logging

from octavo.config import OctavoConfig
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)


class Worker:
    def __init__(
        self,
        config: OctavoConfig,
        rank: int = 0,
        local_rank: int = 0,
        init_method: str | None = None,
    ) -> None:
        from octavo.distributed.parallel_state import init_distributed, set_expert_parallel
        from octavo.platforms import current_platform
        from octavo.worker.model_runner import ModelRunner

        self.config = config
        self.rank = rank
        world = config.parallel_config.tensor_parallel_size
        platform = current_platform
        platform.set_device(platform.device(local_rank))
        self.tp = init_distributed(platform.communicator, rank, world, init_method)
        set_expert_parallel(config.parallel_config.enable_expert_parallel)
        platform.seed_everything(config.model_config.seed)
        runner_cls = ModelRunner
        if config.model_config.model_impl == "onnxruntime":
            from octavo.onnx.runner import OnnxModelRunner as runner_cls
        self.runner = runner_cls(config, platform, local_rank=local_rank)
        self.runner.load_model()

    # Calls the executor makes (results only matter from rank 0, except where noted).
    def determine_num_blocks(self) -> int:
        """This rank's capacity; the executor takes the minimum over ranks."""
        return self.runner.determine_num_blocks()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        out = self.runner.execute_model(so)
        return out if self.rank == 0 else None

    def propose_drafts(self, num_drafts: dict[str, int]) -> dict[str, list[int]] | None:
        """Draft-model proposals (every rank runs the draft; rank 0 answers)."""
        out = self.runner.propose_drafts(num_drafts)
        return out if self.rank == 0 else None

    def info(self) -> dict:
        r = self.runner
        moe_layers = getattr(r.model, "moe_layers", None)
        moe = moe_layers() if callable(moe_layers) else []
        return {
            "attn_backend": r.attn_backend.name,
            "model_bytes": r.model_bytes(),
            "load_seconds": r.load_seconds,
            "graphs": "{} ({})".format(*r.graph_choice()),
            # Mixture-of-experts placement and kernel on this rank ("" for dense models).
            "moe": f"{len(moe)} MoE layers, {moe[0].describe()}" if moe else "",
            # Quantized linear layers: weight kind -> kernel chosen ("" when unquantized).
            "quantization": r.quant_kernels.summary() if r.quant_kernels is not None else "",
        }

    def shutdown(self) -> None:
        from octavo.distributed.parallel_state import destroy_distributed

        destroy_distributed()
