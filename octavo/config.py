"""Engine configuration: a few frozen dataclasses, built once from CLI flags or kwargs.

``EngineArgs`` carries every user-facing knob under its vLLM name; ``create_engine_config``
validates each one (errors name the flag and the allowed range), reads the checkpoint's
``config.json`` and lets the platform apply its policy (``check_and_update_config``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from octavo import envs

logger = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = Path(__file__).parent / "assets" / "default_model"

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')} ({name})"


def _check(cond: bool, name: str, rng: str, value: Any) -> None:
    if not cond:
        raise ValueError(f"{_flag(name)} must be {rng}; got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    model: str
    tokenizer: str
    architecture: str
    dtype: torch.dtype
    max_model_len: int
    seed: int
    load_format: str
    served_model_name: str
    hf_config: Any = field(compare=False, repr=False)
    # Request defaults from the model's generation_config.json (``--generation-config``):
    # SamplingParams field -> value, for the fields a request leaves unset.
    sampling_defaults: dict[str, Any] = field(default_factory=dict, compare=False)
    # The quantization method in effect (octavo.quantization); None for unquantized weights.
    quantization: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size

    @property
    def num_layers(self) -> int:
        return self.hf_config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.hf_config.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return getattr(self.hf_config, "num_key_value_heads", None) or self.num_heads

    def kv_heads_per_rank(self, tensor_parallel_size: int) -> int:
        """KV heads one tensor-parallel rank holds (replicated when tp > num_kv_heads)."""
        return max(1, self.num_kv_heads // tensor_parallel_size)

    @property
    def head_size(self) -> int:
        c = self.hf_config
        return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads

    @property
    def hidden_size(self) -> int:
        return self.hf_config.hidden_size


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    # Host memory for the KV cache on platforms without device memory (CPU), in bytes.
    cpu_kvcache_space_bytes: int | None = None
    prefix_hash: str = "builtin"


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    # Schedule step N+1 while step N runs on the device (see octavo/core/scheduler.py).
    async_scheduling: bool = False


@dataclass(frozen=True)
class DeviceConfig:
    device: str = "cpu"


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str = "mp"


@dataclass(frozen=True)
class OctavoConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig
    parallel_config: ParallelConfig
    enforce_eager: bool = False

    def replace(self, **kwargs: Any) -> OctavoConfig:
        return dataclasses.replace(self, **kwargs)


def resolve_model_path(model: str | None) -> str:
    """A local folder, or a Hub id already in the local Hugging Face cache. Never downloads."""
    if model is None:
        model = envs.OCTAVO_DEFAULT_MODEL or str(DEFAULT_MODEL_DIR)
    if os.path.isdir(model):
        if not os.path.exists(os.path.join(model, "config.json")):
            raise ValueError(f"--model (model): {model!r} has no config.json")
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, local_files_only=True)
    except Exception:
        raise ValueError(
            f"--model (model): {model!r} is not a local folder and is not in the local "
            "Hugging Face cache (octavo never downloads at run time)"
        ) from None


# generation_config.json fields that become SamplingParams defaults (vLLM's sampling set).
# ``max_new_tokens`` is not taken: a default length could exceed what a long prompt leaves
# of the context and turn a valid request into an error; the limit stays the request's own
# (or the context).
_GENERATION_FIELDS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}


def load_sampling_defaults(folder: str | None) -> dict[str, Any]:
    """The sampling fields a folder's ``generation_config.json`` sets to non-default values.

    ``{}`` when ``folder`` is None or has no such file; ``ValueError`` naming the flag and the
    file when it cannot be read or its values are not valid sampling parameters.
    """
    if folder is None:
        return {}
    path = os.path.join(folder, "generation_config.json")
    if not os.path.exists(path):
        return {}
    from transformers import GenerationConfig

    try:
        diff = GenerationConfig.from_pretrained(folder).to_diff_dict()
    except Exception as e:  # transformers raises several types for a bad file
        raise ValueError(f"{_flag('generation_config')}: cannot read {path}: {e}") from None
    defaults = {ours: diff[theirs] for theirs, ours in _GENERATION_FIELDS.items() if diff.get(theirs) is not None}
    from octavo.sampling_params import SamplingParams

    try:
        SamplingParams(**defaults)
    except ValueError as e:
        raise ValueError(f"{_flag('generation_config')}: {path} sets invalid sampling defaults: {e}") from None
    return defaults


def load_hf_config(model_dir: str):
    from transformers import AutoConfig

    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    from octavo.models.registry import resolve_architecture

    resolve_architecture(raw.get("architectures"))  # fail early, before transformers
    return AutoConfig.from_pretrained(model_dir)


@dataclass
class EngineArgs:
    model: str | None = None
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    load_format: str = "auto"
    block_size: int | None = None
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256
    scheduling_policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str = "mp"
    enforce_eager: bool = False
    # None: on for accelerators with one device, off on CPU (where a step runs synchronously).
    async_scheduling: bool | None = None
    # "auto": request defaults from the model's generation_config.json; "vllm" (or "none"):
    # none; else a folder holding a generation_config.json.
    generation_config: str = "auto"
    # vLLM's --quantization: a method name, or None to follow the checkpoint's quantization_config.
    quantization: str | None = None

    def _validate(self) -> None:
        _check(self.dtype in ("auto", *_DTYPES), "dtype", f"auto or one of {sorted(_DTYPES)}", self.dtype)
        _check(self.load_format in ("auto", "safetensors", "dummy"), "load_format", "auto, safetensors or dummy", self.load_format)
        if self.max_model_len is not None:
            _check(self.max_model_len >= 1, "max_model_len", ">= 1", self.max_model_len)
        if self.block_size is not None:
            bs = self.block_size
            _check(bs >= 1 and bs <= 256 and bs & (bs - 1) == 0, "block_size", "a power of two in [1, 256]", bs)
        if self.num_gpu_blocks_override is not None:
            _check(self.num_gpu_blocks_override >= 2, "num_gpu_blocks_override", ">= 2", self.num_gpu_blocks_override)
        _check(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization", "in (0, 1]", self.gpu_memory_utilization)
        if self.max_num_batched_tokens is not None:
            _check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", ">= 1", self.max_num_batched_tokens)
        _check(self.max_num_seqs >= 1, "max_num_seqs", ">= 1", self.max_num_seqs)
        _check(self.scheduling_policy in ("fcfs", "priority"), "scheduling_policy", "fcfs or priority", self.scheduling_policy)
        _check(self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold", ">= 0", self.long_prefill_token_threshold)
        _check(self.tensor_parallel_size >= 1, "tensor_parallel_size", ">= 1", self.tensor_parallel_size)
        _check(self.pipeline_parallel_size == 1, "pipeline_parallel_size", "1 (pipeline parallelism is reserved)", self.pipeline_parallel_size)
        _check(self.distributed_executor_backend in ("mp", "ray"), "distributed_executor_backend", "mp or ray", self.distributed_executor_backend)
        if self.async_scheduling:
            _check(self.tensor_parallel_size == 1, "async_scheduling", "off with tensor_parallel_size > 1 (multi-process steps are synchronous)", self.async_scheduling)

    def create_engine_config(self) -> OctavoConfig:
        from octavo.platforms import current_platform

        self._validate()
        model_dir = resolve_model_path(self.model)
        hf_config = load_hf_config(model_dir)
        from octavo.models.registry import resolve_architecture

        arch, _ = resolve_architecture(getattr(hf_config, "architectures", None))
        from octavo.quantization import resolve_quantization

        quantization = resolve_quantization(
            self.quantization, getattr(hf_config, "quantization_config", None),
            current_platform.name, current_platform.supported_quantization,
        )

        if self.dtype == "auto":
            ckpt = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
            if isinstance(ckpt, str):
                ckpt = _DTYPES.get(ckpt)
            dtype = current_platform.resolve_auto_dtype(ckpt)
        else:
            dtype = _DTYPES[self.dtype]
            supported = current_platform.supported_dtypes()
            if dtype not in supported:
                raise ValueError(
                    f"{_flag('dtype')} {self.dtype} is not supported on {current_platform.name}; "
                    f"supported: {[str(d).removeprefix('torch.') for d in supported]}"
                )

        limit = getattr(hf_config, "max_position_embeddings", None) or 2048
        window = getattr(hf_config, "sliding_window", None)
        if window and getattr(hf_config, "use_sliding_window", True) and window < limit:
            logger.warning("sliding window attention (%d) is not implemented; capping the context at it", window)
            limit = window
        if self.max_model_len is None:
            max_model_len = limit
        else:
            _check(self.max_model_len <= limit, "max_model_len", f"<= {limit} (the model's context length)", self.max_model_len)
            max_model_len = self.max_model_len

        if self.max_num_batched_tokens is None:
            batched = max(2048, self.max_num_seqs) if self.enable_chunked_prefill else max(max_model_len, 2048)
        else:
            batched = self.max_num_batched_tokens
        if not self.enable_chunked_prefill:
            _check(batched >= max_model_len, "max_num_batched_tokens", f">= max_model_len ({max_model_len}) without chunked prefill", batched)

        if self.generation_config == "auto":
            gen_folder: str | None = model_dir
        elif self.generation_config in ("vllm", "none"):
            gen_folder = None
        else:
            _check(os.path.isdir(self.generation_config), "generation_config",
                   "auto, vllm, none or a folder with a generation_config.json", self.generation_config)
            gen_folder = self.generation_config
        sampling_defaults = load_sampling_defaults(gen_folder)
        if sampling_defaults:
            logger.info(
                "default sampling parameters from %s/generation_config.json (used where a request "
                "sets none; --generation-config vllm ignores them): %s", gen_folder, sampling_defaults,
            )

        async_scheduling = self.async_scheduling
        if async_scheduling is None:
            async_scheduling = current_platform.device_type != "cpu" and self.tensor_parallel_size == 1

        model_config = ModelConfig(
            model=model_dir,
            tokenizer=self.tokenizer or model_dir,
            architecture=arch,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=self.seed,
            load_format=self.load_format,
            served_model_name=self.served_model_name or (self.model or "octavo-default"),
            hf_config=hf_config,
            sampling_defaults=sampling_defaults,
            quantization=quantization,
        )
        config = OctavoConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=self.block_size or current_platform.default_block_size,
                enable_prefix_caching=self.enable_prefix_caching,
                num_gpu_blocks_override=self.num_gpu_blocks_override,
                gpu_memory_utilization=self.gpu_memory_utilization,
                kv_cache_dtype=self.kv_cache_dtype,
                prefix_hash=envs.OCTAVO_PREFIX_HASH,
            ),
            scheduler_config=SchedulerConfig(
                max_num_batched_tokens=batched,
                max_num_seqs=self.max_num_seqs,
                max_model_len=max_model_len,
                policy=self.scheduling_policy,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
                enable_chunked_prefill=self.enable_chunked_prefill,
                async_scheduling=async_scheduling,
            ),
            device_config=DeviceConfig(device=current_platform.device_type),
            parallel_config=ParallelConfig(
                tensor_parallel_size=self.tensor_parallel_size,
                pipeline_parallel_size=self.pipeline_parallel_size,
                distributed_executor_backend=self.distributed_executor_backend,
            ),
            enforce_eager=self.enforce_eager,
        )
        return current_platform.check_and_update_config(config)

    # -- CLI ----------------------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
        d = EngineArgs()
        if not model_positional:
            parser.add_argument("--model", default=None, help="Model folder or cached Hub id (default: the shipped model).")
        parser.add_argument("--tokenizer", default=None)
        parser.add_argument("--served-model-name", default=None)
        parser.add_argument("--dtype", default=d.dtype, help="auto, float32, bfloat16, float16.")
        parser.add_argument("--max-model-len", type=int, default=None)
        parser.add_argument("--seed", type=int, default=d.seed)
        parser.add_argument("--load-format", default=d.load_format, choices=["auto", "safetensors", "dummy"])
        parser.add_argument("--block-size", type=int, default=None)
        parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
        parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
        parser.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
        parser.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype)
        parser.add_argument("--max-num-batched-tokens", type=int, default=None)
        parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
        parser.add_argument("--scheduling-policy", default=d.scheduling_policy, choices=["fcfs", "priority"])
        parser.add_argument("--long-prefill-token-threshold", type=int, default=0)
        parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
        parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
        parser.add_argument("--distributed-executor-backend", default="mp", choices=["mp", "ray"])
        parser.add_argument("--enforce-eager", action="store_true")
        parser.add_argument(
            "--quantization", "-q", default=None,
            help="Quantization method (vLLM's names). Default: the checkpoint's quantization_config, "
            "if any. A method octavo cannot run is refused at load, never silently ignored.",
        )
        parser.add_argument(
            "--generation-config", default=d.generation_config,
            help="auto: default sampling parameters from the model's generation_config.json; vllm or "
            "none: ignore it; or a folder holding one.",
        )
        parser.add_argument(
            "--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
            help="Prepare the next step while the device runs the current one (default: on for one accelerator, off on CPU).",
        )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})
