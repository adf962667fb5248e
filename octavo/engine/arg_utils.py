"""``EngineArgs``: every user-facing knob under its vLLM name, and the builder of ``OctavoConfig``.

``create_engine_config`` validates each flag (errors name the flag and the allowed range), reads
the checkpoint's ``config.json`` and ``generation_config.json``, and lets the platform apply its
policy (``check_and_update_config``). It lives in the engine layer because it needs the platform
and the model registry; the frozen config dataclasses it builds (``octavo.config``) need neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from octavo.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    OctavoConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    StructuredOutputsConfig,
)
from octavo.core.block_hash import get_hash_function
from octavo.engine.model_files import (
    flag,
    load_hf_config,
    load_sampling_defaults,
    resolve_model_path,
    resolve_tokenizer_path,
)
from octavo.platforms import current_platform
from octavo.quantization import checkpoint_method, resolve_quantization
from octavo.spec_decode.config import parse_speculative_config
from octavo.spec_decode.draft_check import check_same_tokenizer, check_same_vocab
from octavo.utils.extras import require_extra

logger = logging.getLogger(__name__)

STR_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}

# --load-format values (vLLM's names): auto picks safetensors, then pt (.bin), or gguf for a .gguf file.
LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")

# --model-impl values: vLLM's flag, with octavo's own torch models and ONNX Runtime as the choices.
MODEL_IMPLS = ("auto", "octavo", "onnxruntime")

# Context length assumed when config.json names none (vLLM's fallback too).
FALLBACK_MAX_MODEL_LEN = 2048
# Default token budget of one step with chunked prefill (vLLM's default for online serving).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


def _check(cond: bool, name: str, rng: str, value: Any) -> None:
    if not cond:
        raise ValueError(f"{flag(name)} must be {rng}; got {value!r}")


@dataclass
class EngineArgs:
    """Every user-facing engine knob under its vLLM name. Each field's docstring is its
    ``--flag`` help text (``octavo/entrypoints/engine_cli.py`` reads them from this source)."""

    model: str | None = None
    """Model folder or cached Hugging Face Hub id (default: the small model shipped with octavo)."""
    tokenizer: str | None = None
    """Tokenizer folder or Hub id (default: the model's own)."""
    revision: str | None = None
    """Hub revision of the model: a branch, tag or commit (Hub ids only)."""
    tokenizer_revision: str | None = None
    """Hub revision of --tokenizer (Hub ids only)."""
    download_dir: str | None = None
    """Where Hub downloads go (default: the Hugging Face cache)."""
    served_model_name: str | list[str] | None = None
    """Name(s) the OpenAI API answers to; responses carry the first (default: the model argument, or octavo-default)."""
    dtype: str = "auto"
    """Weight and activation dtype: auto (the checkpoint's, if the platform supports it), float32, bfloat16 or float16."""
    max_model_len: int | None = None
    """Longest context (prompt + output) in tokens (default: the model's max_position_embeddings)."""
    seed: int = 0
    """Random seed of the engine (weights of --load-format dummy, unseeded sampling)."""
    load_format: str = "auto"
    """auto or safetensors: load the checkpoint's weights; dummy: random weights of the same shapes (benchmarks)."""
    block_size: int | None = None
    """Tokens per KV cache block, a power of two up to 256 (default: the platform's)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes across requests."""
    prefix_caching_hash_algo: str = "sha256"
    """Block hash of the prefix cache: sha256 (cryptographic) or xxhash (faster, keyed 128-bit; needs the xxhash package)."""
    num_gpu_blocks_override: int | None = None
    """Use exactly this many KV cache blocks instead of sizing the cache from memory."""
    gpu_memory_utilization: float = 0.9
    """Fraction of accelerator memory octavo may use (weights + KV cache), in (0, 1]. The CPU sizes its cache from OCTAVO_CPU_KVCACHE_SPACE (default: the workload) instead."""
    kv_cache_dtype: str = "auto"
    """KV cache dtype: auto (the model dtype) or one the platform lists in `octavo info`."""
    max_num_batched_tokens: int | None = None
    """Token budget of one engine step, prefill chunks and decodes together (default: 2048 or more)."""
    max_num_seqs: int = 256
    """Most requests running at once."""
    scheduling_policy: str = "fcfs"
    """fcfs: first come first served; priority: lower request priority values run first."""
    long_prefill_token_threshold: int = 0
    """Cap on the prompt tokens one request may prefill per step (0: no cap)."""
    enable_chunked_prefill: bool = True
    """Split long prompts into chunks that share steps with decodes."""
    tensor_parallel_size: int = 1
    """Split every layer across this many devices (CPU: worker processes), at most the devices (cores) present."""
    pipeline_parallel_size: int = 1
    """Reserved: must be 1."""
    distributed_executor_backend: str = "mp"
    """How tensor-parallel workers start: mp (local processes) or ray (a Ray cluster; the ray extra)."""
    enable_expert_parallel: bool = False
    """Mixture-of-experts models: each tensor-parallel rank holds E/N whole experts (default: every expert is sharded across the ranks like a dense MLP)."""
    enforce_eager: bool = False
    """Never capture graphs (CUDA/HIP graphs, XLA compilation); run every step eagerly."""
    async_scheduling: bool | None = None
    """Prepare the next step while the device runs the current one (default: on for one accelerator, off on CPU)."""
    generation_config: str = "auto"
    """auto: default sampling parameters from the model's generation_config.json; vllm or none: ignore it; or a folder holding one."""
    quantization: str | None = None
    """Quantization method (vLLM's names). Default: the checkpoint's quantization_config, if any. A method octavo cannot run is refused at load, never silently ignored."""
    model_impl: str = "auto"
    """What runs the model: octavo (its own torch models), onnxruntime (a folder written by `octavo export onnx`, on the CPU), or auto (onnxruntime for such a folder, else octavo)."""
    trust_remote_code: bool = False
    """Accepted for vLLM compatibility; octavo never runs a checkpoint's own Python code, so setting it is an error."""
    structured_outputs_config: str | dict | None = None
    """Structured outputs as JSON: {"backend": "auto"|"xgrammar", "disable_any_whitespace": false, "reasoning_parser": null}."""
    guided_decoding_backend: str | None = None
    """Older name of the structured outputs backend (auto or xgrammar)."""
    speculative_config: str | dict | None = None
    """Speculative decoding as JSON (vLLM's keys): {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 5, "prompt_lookup_max": 5} or {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": k} (a smaller checkpoint with the same tokenizer) or {"method": "eagle", "model": HEAD, "num_speculative_tokens": k} (an EAGLE-1 head of the target; "eagle3": an EAGLE-3 head). Turns async scheduling off."""
    reasoning_parser: str | None = None
    """Split <think>...</think> into reasoning_content (deepseek_r1 or qwen3); structured outputs apply after it."""

    def served_model_names(self) -> list[str]:
        """The --served-model-name values as a list ([] when none was given)."""
        names = self.served_model_name
        return [] if names is None else [names] if isinstance(names, str) else list(names)

    def _validate(self) -> None:
        if self.trust_remote_code:
            raise ValueError(
                f"{flag('trust_remote_code')}: octavo does not run a checkpoint's own Python code; "
                "it implements the architectures in its model registry itself, so drop the flag for "
                "those, or add the architecture to octavo"
            )
        if self.served_model_name is not None and not all(self.served_model_names()):
            raise ValueError(f"{flag('served_model_name')} must be non-empty names; got {self.served_model_name!r}")
        _check(self.dtype in ("auto", *STR_DTYPES), "dtype", f"auto or one of {sorted(STR_DTYPES)}", self.dtype)
        _check(self.load_format in LOAD_FORMATS, "load_format", ", ".join(LOAD_FORMATS), self.load_format)
        _check(self.model_impl in MODEL_IMPLS, "model_impl", ", ".join(MODEL_IMPLS), self.model_impl)
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
        get_hash_function(self.prefix_caching_hash_algo)  # an unknown name or a missing package
        _check(self.max_num_seqs >= 1, "max_num_seqs", ">= 1", self.max_num_seqs)
        _check(self.scheduling_policy in ("fcfs", "priority"), "scheduling_policy", "fcfs or priority", self.scheduling_policy)
        _check(self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold", ">= 0", self.long_prefill_token_threshold)
        _check(self.tensor_parallel_size >= 1, "tensor_parallel_size", ">= 1", self.tensor_parallel_size)
        _check(self.pipeline_parallel_size == 1, "pipeline_parallel_size", "1 (pipeline parallelism is reserved)", self.pipeline_parallel_size)
        _check(self.distributed_executor_backend in ("mp", "ray"), "distributed_executor_backend", "mp or ray", self.distributed_executor_backend)
        if self.async_scheduling:
            _check(self.tensor_parallel_size == 1, "async_scheduling", "off with tensor_parallel_size > 1 (multi-process steps are synchronous)", self.async_scheduling)

    # -- the builder: one function per seam ------------------------------------------------
    def create_engine_config(self) -> OctavoConfig:
        """Validate every flag, read the checkpoint, and apply the platform's policy."""
        self._validate()
        model_config = self._model_config()
        speculative_config = self._speculative_config(model_config)
        drafting = speculative_config is not None and speculative_config.uses_drafter
        cache_config = self._cache_config(model_config, drafting)
        host_drafts = speculative_config is not None and not drafting
        if host_drafts:
            _check(not self.async_scheduling, "async_scheduling", f"off with {flag('speculative_config')} method "
                   f"{speculative_config.method!r} (its drafts are read from the previous step's tokens on the "
                   "host; draft_model, eagle and eagle3 run with async scheduling)", self.async_scheduling)
        config = OctavoConfig(
            model_config=model_config,
            cache_config=cache_config,
            scheduler_config=self._scheduler_config(model_config.max_model_len, host_drafts),
            device_config=DeviceConfig(device=current_platform.device_type),
            parallel_config=ParallelConfig(
                tensor_parallel_size=self.tensor_parallel_size,
                pipeline_parallel_size=self.pipeline_parallel_size,
                distributed_executor_backend=self.distributed_executor_backend,
                enable_expert_parallel=self.enable_expert_parallel,
            ),
            enforce_eager=self.enforce_eager,
            structured_outputs_config=self._structured_outputs_config(),
            speculative_config=speculative_config,
        )
        return current_platform.check_and_update_config(config)

    def _speculative_config(self, target: ModelConfig) -> SpeculativeConfig | None:
        """``--speculative-config`` parsed; for ``draft_model`` the draft checkpoint resolved,
        checked against the target and given its own ``ModelConfig``."""
        cfg = parse_speculative_config(self.speculative_config)
        if cfg is None or not cfg.uses_drafter:
            return cfg
        if target.model_impl != "octavo":
            raise ValueError(f"{flag('speculative_config')}: method {cfg.method!r} is not supported with "
                             "--model-impl onnxruntime")
        if cfg.method in ("eagle", "eagle3"):
            return self._eagle_config(cfg, target)
        draft_dir = resolve_model_path(cfg.model, None, self.download_dir)
        hf_config, arch = load_hf_config(draft_dir)
        check_same_vocab(target.hf_config, hf_config, target.model, draft_dir)
        self._check_draft(hf_config, draft_dir, target)
        draft = dataclasses.replace(
            target, model=draft_dir, tokenizer=draft_dir, architecture=arch, hf_config=hf_config,
            served_model_name=cfg.model, sampling_defaults={}, quantization=None,
        )
        return dataclasses.replace(cfg, model=draft_dir, draft_model_config=draft)

    def _eagle_config(self, cfg: SpeculativeConfig, target: ModelConfig) -> SpeculativeConfig:
        """``method: eagle`` / ``eagle3``: the head resolved, checked against the target, given a
        ``ModelConfig``."""
        from octavo.models.length_rope import length_rope
        from octavo.spec_decode.eagle_check import check_eagle_head, load_eagle_config

        head_dir = resolve_model_path(cfg.model, None, self.download_dir)
        hf_config, arch = load_eagle_config(head_dir, cfg.method)
        check_eagle_head(target.hf_config, hf_config, head_dir, target.model, self.tensor_parallel_size, cfg.method)
        for what, c in (("target", target.hf_config), ("EAGLE head", hf_config)):
            if length_rope(c, target.max_model_len) is not None:
                raise ValueError(f"{flag('speculative_config')}: the {what}'s RoPE depends on the sequence "
                                 "length; octavo runs EAGLE heads with fixed-RoPE models only")
        head = dataclasses.replace(
            target, model=head_dir, architecture=arch, hf_config=hf_config,
            served_model_name=cfg.model, sampling_defaults={}, quantization=None,
        )
        return dataclasses.replace(cfg, model=head_dir, draft_model_config=head)

    def _check_draft(self, hf_config: Any, draft_dir: str, target: ModelConfig) -> None:
        """What octavo's draft runner needs of the checkpoint (errors name the problem)."""
        from octavo.models.length_rope import length_rope

        name = flag("speculative_config")
        if getattr(hf_config, "quantization_config", None) is not None:
            raise ValueError(f"{name}: the draft model {draft_dir} is quantized; octavo runs unquantized drafts only")
        if context_limit(hf_config) < target.max_model_len:
            raise ValueError(
                f"{name}: the draft model {draft_dir} has a context of {context_limit(hf_config)} tokens, "
                f"less than {flag('max_model_len')} {target.max_model_len}; lower --max-model-len"
            )
        if length_rope(hf_config, target.max_model_len) is not None:
            raise ValueError(f"{name}: the draft model {draft_dir}'s RoPE depends on the sequence length; "
                             "octavo drafts with fixed-RoPE models only")
        if has_tokenizer(draft_dir) and has_tokenizer(target.tokenizer):
            from octavo.engine.tokenizer import load_tokenizer

            check_same_tokenizer(load_tokenizer(target.tokenizer), load_tokenizer(draft_dir), draft_dir)

    def _structured_outputs_config(self) -> StructuredOutputsConfig:
        """From --structured-outputs-config (JSON or a dict), --guided-decoding-backend and
        --reasoning-parser; unknown keys, backends and parsers are errors naming them."""
        from octavo.structured_output.grammar import check_backend
        from octavo.structured_output.reasoning import check_reasoning_parser

        name, value = flag("structured_outputs_config"), self.structured_outputs_config
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise ValueError(f"{name} must be a JSON object: {e}") from None
        if not isinstance(value or {}, dict):
            raise ValueError(f"{name} must be a JSON object; got {value!r}")
        d = dict(value or {})
        known = [f.name for f in dataclasses.fields(StructuredOutputsConfig)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"{name}: unknown keys {unknown}; known: {known}")
        if self.guided_decoding_backend is not None:
            d.setdefault("backend", self.guided_decoding_backend)
        if self.reasoning_parser is not None:
            d.setdefault("reasoning_parser", self.reasoning_parser)
        cfg = StructuredOutputsConfig(**d)
        try:
            check_backend(cfg.backend)
            check_reasoning_parser(cfg.reasoning_parser)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        _check(isinstance(cfg.disable_any_whitespace, bool), "structured_outputs_config",
               "disable_any_whitespace true or false", cfg.disable_any_whitespace)
        return cfg

    def _model_config(self) -> ModelConfig:
        model_dir = resolve_model_path(self.model, self.revision, self.download_dir)
        hf_config, arch = load_hf_config(model_dir)
        self._check_experts(hf_config, arch)
        impl = self._model_impl(model_dir)
        return ModelConfig(
            model=model_dir,
            tokenizer=resolve_tokenizer_path(self.tokenizer, model_dir, self.tokenizer_revision, self.download_dir),
            architecture=arch,
            dtype=self._onnx_dtype(model_dir) if impl == "onnxruntime" else self._dtype(hf_config),
            max_model_len=self._max_model_len(hf_config),
            seed=self.seed,
            load_format=self.load_format,
            served_model_name=(self.served_model_names() or [self.model or "octavo-default"])[0],
            hf_config=hf_config,
            sampling_defaults=self._sampling_defaults(model_dir),
            quantization=None if impl == "onnxruntime" else self._quantization(hf_config, arch),
            model_impl=impl,
        )

    def _model_impl(self, model_dir: str) -> str:
        """``--model-impl`` resolved; ``onnxruntime`` checked against every other flag."""
        from octavo.onnx.model_dir import is_onnx_export, require_onnx_export

        impl = self.model_impl
        if impl == "auto":
            impl = "onnxruntime" if is_onnx_export(model_dir) else "octavo"
            if impl == "onnxruntime":
                logger.info("%s is an ONNX export: --model-impl onnxruntime", model_dir)
        if impl != "onnxruntime":
            return impl
        require_extra("onnx", "--model-impl onnxruntime", ("onnxruntime", "onnx"))
        require_onnx_export(model_dir)
        why = "ONNX Runtime runs the exported model as it is"
        for name, ok, rng in (
            ("quantization", self.quantization is None, f"unset ({why}: quantize at export, --quantize int4|int8)"),
            ("load_format", self.load_format == "auto", f"auto ({why})"),
            ("kv_cache_dtype", self.kv_cache_dtype == "auto", f"auto ({why}: the export's dtype)"),
            ("tensor_parallel_size", self.tensor_parallel_size == 1, "1 with --model-impl onnxruntime"),
        ):
            _check(ok, name, rng, getattr(self, name))
        if not current_platform.device_is_host():
            raise ValueError(
                f"--model-impl onnxruntime runs on the CPU platform (ONNX Runtime's CPU execution "
                f"provider), not {current_platform.name}; set OCTAVO_PLATFORM=cpu"
            )
        return impl

    def _onnx_dtype(self, model_dir: str) -> torch.dtype:
        """The exported model's dtype; an explicit ``--dtype`` must name it."""
        from octavo.onnx.model_dir import export_kv_dtype

        dtype = export_kv_dtype(model_dir)
        if self.dtype != "auto" and STR_DTYPES[self.dtype] != dtype:
            raise ValueError(
                f"{flag('dtype')} {self.dtype}: the ONNX model in {model_dir} was exported as "
                f"{str(dtype).removeprefix('torch.')}; drop --dtype or export again with another --dtype"
            )
        return dtype

    def _quantization(self, hf_config: Any, arch: str) -> str | None:
        """The method in effect; a method octavo cannot honour is refused here, at load."""
        from octavo.models.registry import MOE_ARCHITECTURES

        qc = getattr(hf_config, "quantization_config", None)
        wanted = self.quantization or checkpoint_method(qc)
        if wanted is not None and arch in MOE_ARCHITECTURES:
            raise ValueError(
                f"quantization method {wanted!r} is not supported for mixture-of-experts models "
                f"({arch}): the expert kernels run bfloat16, float16 or float32 weights only"
            )
        method = resolve_quantization(
            self.quantization, qc, current_platform.name, current_platform.supported_quantization,
            getattr(current_platform, "supported_online_quantization", ()),
        )
        return method

    def _check_experts(self, hf_config: Any, arch: str) -> None:
        """``--enable-expert-parallel`` needs experts, and the experts must split over the ranks."""
        from octavo.models.registry import MOE_ARCHITECTURES

        if arch not in MOE_ARCHITECTURES:
            if self.enable_expert_parallel:
                raise ValueError(
                    f"{flag('enable_expert_parallel')} applies to mixture-of-experts models; {arch} has "
                    f"no experts (MoE architectures: {', '.join(sorted(MOE_ARCHITECTURES))})"
                )
            return
        from octavo.models.llama_moe import moe_spec

        spec, tp = moe_spec(hf_config), self.tensor_parallel_size
        if self.enable_expert_parallel and spec.num_experts % tp:
            raise ValueError(
                f"{flag('enable_expert_parallel')}: the model's {spec.num_experts} experts do not divide "
                f"over {flag('tensor_parallel_size')} {tp} ranks"
            )
        if not self.enable_expert_parallel and spec.intermediate_size % tp:
            raise ValueError(
                f"the experts' intermediate size ({spec.intermediate_size}) is not divisible by "
                f"{flag('tensor_parallel_size')} {tp}; try --enable-expert-parallel"
            )

    def _dtype(self, hf_config: Any) -> torch.dtype:
        """``auto``: the platform's choice for the checkpoint's dtype; else the flag, if supported."""
        if self.dtype == "auto":
            ckpt = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
            if isinstance(ckpt, str):
                ckpt = STR_DTYPES.get(ckpt)
            return current_platform.resolve_auto_dtype(ckpt)
        dtype = STR_DTYPES[self.dtype]
        supported = current_platform.supported_dtypes()
        if dtype not in supported:
            raise ValueError(
                f"{flag('dtype')} {self.dtype} is not supported on {current_platform.name}; "
                f"supported: {[str(d).removeprefix('torch.') for d in supported]}"
            )
        return dtype

    def _max_model_len(self, hf_config: Any) -> int:
        limit = context_limit(hf_config)
        if self.max_model_len is None:
            return limit
        _check(self.max_model_len <= limit, "max_model_len", f"<= {limit} (the model's context length)", self.max_model_len)
        return self.max_model_len

    def _sampling_defaults(self, model_dir: str) -> dict[str, Any]:
        if self.generation_config == "auto":
            folder: str | None = model_dir
        elif self.generation_config in ("vllm", "none"):
            folder = None
        else:
            _check(os.path.isdir(self.generation_config), "generation_config",
                   "auto, vllm, none or a folder with a generation_config.json", self.generation_config)
            folder = self.generation_config
        defaults = load_sampling_defaults(folder)
        if defaults:
            logger.info(
                "default sampling parameters from %s/generation_config.json (used where a request "
                "sets none; --generation-config vllm ignores them): %s", folder, defaults,
            )
        return defaults

    def _cache_config(self, model_config: ModelConfig, drafting: bool = False) -> CacheConfig:
        from octavo.core.kv_cache_groups import make_kv_cache_groups
        from octavo.models.sliding_window import layer_sliding_windows

        windows = layer_sliding_windows(model_config.hf_config)
        if model_config.model_impl == "onnxruntime" and len(set(windows)) > 1:
            # One exported graph reads every layer's past through one block table.
            windows = [None] * len(windows)
        if drafting and any(w is not None for w in windows):
            # A draft model attends over the whole context (or its own window) through the
            # target's block table: blocks behind the target's windows are kept, not freed.
            logger.info("draft model: KV blocks behind the target's sliding windows are kept (the draft reads them)")
            windows = [None] * len(windows)

        return CacheConfig(
            block_size=self.block_size or current_platform.default_block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_dtype=self.kv_cache_dtype,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            kv_cache_groups=make_kv_cache_groups(windows),
        )

    def _scheduler_config(self, max_model_len: int, host_drafts: bool = False) -> SchedulerConfig:
        """``host_drafts``: n-gram speculation, whose drafts need each step's tokens on the host
        (async scheduling stays off by default)."""
        batched = self.max_num_batched_tokens
        if batched is None:
            floor = self.max_num_seqs if self.enable_chunked_prefill else max_model_len
            batched = max(DEFAULT_MAX_NUM_BATCHED_TOKENS, floor)
        if not self.enable_chunked_prefill:
            _check(batched >= max_model_len, "max_num_batched_tokens", f">= max_model_len ({max_model_len}) without chunked prefill", batched)
        async_scheduling = self.async_scheduling
        if async_scheduling is None:
            async_scheduling = (not current_platform.device_is_host() and self.tensor_parallel_size == 1
                                and not host_drafts)
        return SchedulerConfig(
            max_num_batched_tokens=batched,
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_model_len,
            policy=self.scheduling_policy,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            enable_chunked_prefill=self.enable_chunked_prefill,
            async_scheduling=async_scheduling,
        )

    # -- CLI ----------------------------------------------------------------------------
    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})


def has_tokenizer(folder: str) -> bool:
    """A checkpoint folder that carries its own tokenizer files."""
    return os.path.isdir(folder) and any(
        os.path.exists(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )


def context_limit(hf_config: Any) -> int:
    """The longest context the checkpoint supports: its full context, also for sliding-window
    models (the window is per layer, in attention); dynamic NTK RoPE extends it by its factor."""
    from octavo.models.length_rope import context_limit_factor

    mpe = getattr(hf_config, "max_position_embeddings", None)
    if not mpe:
        return FALLBACK_MAX_MODEL_LEN
    return int(mpe * context_limit_factor(hf_config))
