"""Engine configuration: a few frozen dataclasses, built once and never mutated.

They are plain data: this module imports no platform, model or engine code. The builder
(``EngineArgs.create_engine_config`` in ``octavo.engine.arg_utils``) validates the user's flags,
reads the checkpoint and lets the platform apply its policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch


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
    # What runs the model (``--model-impl``): "octavo" (its torch models) or "onnxruntime"
    # (a folder written by ``octavo export onnx``, run by ONNX Runtime).
    model_impl: str = "octavo"

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
class KVCacheGroupSpec:
    """One KV cache group: its window (None = full attention) and its layers, in slot order
    (``octavo/core/kv_cache_groups.py`` builds them and says how they share memory)."""

    sliding_window: int | None
    layers: tuple[int, ...]


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    # Host memory for the KV cache on platforms without device memory (CPU), in bytes.
    cpu_kvcache_space_bytes: int | None = None
    # Block hash of the prefix cache (octavo/core/block_hash.py): sha256 or xxhash.
    prefix_caching_hash_algo: str = "sha256"
    # Which layers share a block list (octavo/core/kv_cache_groups.py): one group per attention
    # type (full, or a sliding window, whose group frees the blocks behind it). Empty: one
    # full-attention group of every layer.
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = ()

    @property
    def group_windows(self) -> tuple[int | None, ...]:
        """The window of each KV cache group (None = full attention)."""
        return tuple(g.sliding_window for g in self.kv_cache_groups) or (None,)


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
    # Mixture-of-experts layers place whole experts on ranks instead of sharding each expert.
    enable_expert_parallel: bool = False


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """``--structured-outputs-config`` (vLLM's names): the grammar backend (``auto`` =
    ``xgrammar``, the only one octavo has), the server-wide JSON whitespace default, and
    ``--reasoning-parser`` (constraints apply after the reasoning section; see
    ``octavo.structured_output.reasoning``). Built and validated by ``EngineArgs``."""

    backend: str = "auto"
    disable_any_whitespace: bool = False
    reasoning_parser: str | None = None


@dataclass(frozen=True)
class SpeculativeConfig:
    """``--speculative-config`` (vLLM's keys). ``method`` ``ngram``: propose up to
    ``num_speculative_tokens`` tokens by matching the last ``n`` tokens
    (``prompt_lookup_min <= n <= prompt_lookup_max``, longest first) against the prompt and
    output so far. ``draft_model``: a smaller checkpoint with the target's vocabulary
    (``model``, a local folder once resolved) proposes them greedily; its ``ModelConfig`` is
    ``draft_model_config``. ``eagle``: an EAGLE-1 head (``model``) fed the target's hidden
    states drafts them; ``draft_model_config`` is the head's; ``eagle3``: an EAGLE-3 head fed three
    of the target's layers. Built and validated by ``octavo.spec_decode.config`` and
    ``EngineArgs``."""

    method: str = "ngram"
    num_speculative_tokens: int = 1
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    model: str | None = None
    draft_model_config: ModelConfig | None = field(default=None, compare=False, repr=False)

    @property
    def uses_drafter(self) -> bool:
        """A model drafts on the target's device (draft model, EAGLE heads); n-gram drafts on the host."""
        return self.method in ("draft_model", "eagle", "eagle3")


@dataclass(frozen=True)
class OctavoConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig
    parallel_config: ParallelConfig
    enforce_eager: bool = False
    structured_outputs_config: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    # None: no speculative decoding.
    speculative_config: SpeculativeConfig | None = None

    def replace(self, **kwargs: Any) -> OctavoConfig:
        return dataclasses.replace(self, **kwargs)
