"""The Platform interface: what the hardware-agnostic engine asks of a kind of hardware.

A platform is a class whose members are all classmethods or class attributes: platforms are
stateless answers, never instantiated. The surface, in four parts:

- detection: ``unavailable_reason()`` (``None`` when the hardware is usable) and
  ``is_available()``. Both are cheap and never initialise a device context, so the API process
  can probe before it forks workers.
- device operations, an explicit list (no ``__getattr__`` fall-through to ``torch.<device>``):
  ``device``, ``device_count``, ``get_device_name``, ``get_device_capability``,
  ``get_device_total_memory``, ``mem_get_info``, ``set_device``, ``synchronize``,
  ``empty_cache``, ``manual_seed``, ``seed_everything``, ``is_pin_memory_available``,
  ``inference_mode``, ``stream_context``, ``new_event``; and, where graphs are replayed,
  ``new_graph``, ``graph_pool_handle``, ``graph_capture_context``.
- capabilities: ``supported_dtypes()`` (the first is what ``dtype="auto"`` falls back to),
  ``supported_kv_cache_dtypes``, ``supported_block_sizes`` / ``default_block_size``,
  ``supported_quantization``.
- choices, each with the reason ``octavo info`` prints: ``get_attn_backend`` (a priority walk),
  ``get_graph_capture``, ``get_communicator``; ``moe_backend_priority`` (mixture-of-experts
  kernels by name, walked by ``octavo.models.moe.kernels.choose_kernel``); and
  ``check_and_update_config``, the single hook for platform policy.

Heavy vendor modules (Triton, IPEX, torch_xla, the C++ extension) are named by qualified class
path and imported only once the platform is chosen. Plugins build against ``api_version``; a
platform whose major version differs from ``PLATFORM_API_VERSION`` is refused at resolution.
"""

from __future__ import annotations

import contextlib
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from octavo.attention.backend import AttentionBackend
    from octavo.config import OctavoConfig

logger = logging.getLogger(__name__)

PLATFORM_API_VERSION = "1.1"
"""Major.minor of the platform interface. The major changes only when a member is removed or
changes meaning; plugins built against another major are refused. 1.1 added
``device_is_host``, ``setup_worker``, the peak-memory statistics, ``graph_pool_bytes`` and
``fused_op_kernels`` (all with defaults, so 1.0 plugins keep working)."""

GRAPH_CAPTURE_MODES = ("none", "torch_compile", "cuda_graph", "hip_graph", "xla_compile")


@dataclass(frozen=True)
class Choice:
    """One decision a platform made, and why (printed by ``octavo info`` and the startup log)."""

    value: str
    reason: str

    def __str__(self) -> str:
        return f"{self.value} ({self.reason})"


class PlatformAPIVersionError(ValueError):
    """A platform declares an interface major version this octavo does not implement."""


def api_major(version: str) -> int:
    return int(str(version).split(".", 1)[0])


def check_api_version(platform_cls: type, source: str) -> None:
    """Refuse a platform built against another major version of the interface.

    ``source`` names where the class came from (a plugin entry point, ``OCTAVO_PLATFORM``) so
    the message tells the user what to upgrade.
    """
    declared = getattr(platform_cls, "api_version", None)
    try:
        ok = declared is not None and api_major(declared) == api_major(PLATFORM_API_VERSION)
    except ValueError:
        ok = False
    if not ok:
        raise PlatformAPIVersionError(
            f"platform {getattr(platform_cls, 'name', platform_cls.__qualname__)!r} from {source} "
            f"declares platform API version {declared!r}, but this octavo implements "
            f"{PLATFORM_API_VERSION} (major versions must match); install a version of the plugin "
            "built for this octavo, or an octavo matching the plugin"
        )
    if api_major(declared) == api_major(PLATFORM_API_VERSION) and declared != PLATFORM_API_VERSION:
        try:
            newer = int(str(declared).split(".")[1]) > int(PLATFORM_API_VERSION.split(".")[1])
        except (IndexError, ValueError):
            newer = False
        if newer:
            logger.warning(
                "platform from %s was built against platform API %s, newer than this octavo's %s; "
                "members it relies on may be missing",
                source,
                declared,
                PLATFORM_API_VERSION,
            )


class Platform:
    """Base class of every platform. Subclasses override class attributes and classmethods.

    Invariants every platform keeps (the conformance kit checks them):
    - ``is_available()`` is ``unavailable_reason() is None`` and touches no device context;
    - ``mem_get_info()`` returns ``(free, total)`` with ``0 <= free <= total`` and ``total > 0``;
    - ``supported_dtypes()`` is non-empty and ``resolve_auto_dtype`` returns one of them;
    - ``default_block_size in supported_block_sizes``;
    - ``get_attn_backend`` returns a backend whose ``validate`` gives no reasons, or raises
      ``ValueError`` listing every candidate's reasons.
    """

    name: ClassVar[str] = "abstract"
    device_type: ClassVar[str] = "cpu"  # torch device type string
    api_version: ClassVar[str] = PLATFORM_API_VERSION
    # The first entry is what dtype="auto" picks when the checkpoint's dtype is unsupported.
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)
    # GPUs and TPUs run float32 checkpoints in their preferred 16-bit type under dtype="auto"
    # (as vLLM does); an explicit --dtype float32 still gets float32.
    auto_casts_float32: ClassVar[bool] = False
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    default_block_size: ClassVar[int] = 16
    supported_block_sizes: ClassVar[tuple[int, ...]] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    supported_quantization: ClassVar[tuple[str, ...]] = ()
    # Methods that may quantize an unquantized checkpoint at load (``--quantization int8``).
    supported_online_quantization: ClassVar[tuple[str, ...]] = ()
    # Kernels for quantized linear layers by priority, per canonical weight kind ("int",
    # "fp8", "int8_w8a8"; names in octavo.quantization.kernels.select); torch_ref is the fallback.
    quant_kernel_priority: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Attention backends by priority: registered names or qualified class paths.
    attn_backend_priority: ClassVar[tuple[str, ...]] = ("torch_ref",)
    # Mixture-of-experts kernels by priority: names in octavo.models.moe.kernels or class paths.
    moe_backend_priority: ClassVar[tuple[str, ...]] = ("torch_ref",)
    graph_capture: ClassVar[str] = "none"
    graph_capture_reason: ClassVar[str] = "no graph capture on this platform"
    communicator: ClassVar[str] = "gloo"
    communicator_reason: ClassVar[str] = "gloo over host memory"
    dist_backend: ClassVar[str] = "gloo"  # the torch.distributed backend name
    # Which fused per-layer kernels (RMSNorm, SiLU-mul, RoPE) the models use on this platform,
    # chosen once when a model is loaded: "triton" (octavo.models.fused_ops), "cpu" (octavo's
    # C++ extension, octavo.models.cpu_fused_ops) or "none" (eager torch).
    fused_op_kernels: ClassVar[str] = "none"
    # Small-batch linears (<= 8 rows): "auto" times a split-K Triton GEMV against the vendor
    # BLAS per weight shape at load, "table" takes the GEMV's default tiling, "off" keeps BLAS.
    decode_gemv: ClassVar[str] = "off"

    @classmethod
    def decode_gemv_policy(cls) -> str:
        """``decode_gemv``, unless ``OCTAVO_DECODE_GEMV`` overrides it (only where the platform
        has the GEMV at all: a platform whose policy is "off" keeps it off)."""
        from octavo import envs

        forced = envs.OCTAVO_DECODE_GEMV
        if forced and cls.decode_gemv != "off":
            if forced not in ("auto", "table", "off"):
                raise ValueError(f"OCTAVO_DECODE_GEMV={forced!r}: expected auto, table or off")
            return forced
        return cls.decode_gemv

    # -- detection ----------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this platform cannot run here, or ``None`` when it can.

        Cheap; never initialises a device context (it may import the vendor's torch module).
        """
        raise NotImplementedError(f"{cls.__name__} must implement unavailable_reason()")

    @classmethod
    def is_available(cls) -> bool:
        """Cheap probe; never initialises a device context."""
        return cls.unavailable_reason() is None

    # -- device operations --------------------------------------------------------------
    @classmethod
    def device(cls, index: int = 0) -> torch.device:
        """The torch device tensors of this platform live on."""
        return torch.device(cls.device_type, index) if cls.device_type != "cpu" else torch.device("cpu")

    @classmethod
    def device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls.name

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> tuple[int, int] | None:
        """(major, minor) compute capability on GPUs; ``None`` where the notion does not apply."""
        return None

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return cls.mem_get_info(device_id)[1]

    @classmethod
    def mem_get_info(cls, device_id: int | None = None) -> tuple[int, int]:
        """(free, total) bytes of the memory that holds weights and the KV cache.

        ``device_id=None`` asks about the current device of this process.
        """
        raise NotImplementedError

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        pass

    @classmethod
    def synchronize(cls) -> None:
        pass

    @classmethod
    def empty_cache(cls) -> None:
        pass

    @classmethod
    def manual_seed(cls, seed: int) -> None:
        """Seed torch's generators on the host and on this platform's devices."""
        torch.manual_seed(seed)

    @classmethod
    def seed_everything(cls, seed: int) -> None:
        """Seed Python's, numpy's and torch's generators (host and device)."""
        random.seed(seed)
        try:
            import numpy as np

            np.random.seed(seed)
        except ImportError:  # pragma: no cover
            pass
        cls.manual_seed(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def device_is_host(cls) -> bool:
        """Whether this platform's tensors live in host memory (the CPU).

        When True the runner uses its numpy inputs zero-copy (nothing is pinned or staged in
        persistent device buffers) and device work has completed when a call returns.
        """
        return cls.device_type == "cpu"

    @classmethod
    def setup_worker(cls, local_rank: int, world_size: int) -> Any:
        """Per-process setup before a worker loads its model (CPU: pin the compute threads).

        Returns a description of what was set up (kept by the runner for ``octavo info`` and
        tests), or None.
        """
        return None

    # -- memory statistics (platforms that profile activation memory at startup) -------
    @classmethod
    def supports_memory_profiling(cls) -> bool:
        """Whether the peak-memory statistics below work, so the KV cache budget can subtract
        a measured activation peak; otherwise ``kv_cache_memory_bytes`` is asked with 0."""
        return False

    @classmethod
    def memory_allocated(cls, device: torch.device) -> int:
        raise NotImplementedError(f"{cls.name} keeps no allocator statistics")

    @classmethod
    def max_memory_allocated(cls, device: torch.device) -> int:
        raise NotImplementedError(f"{cls.name} keeps no allocator statistics")

    @classmethod
    def reset_peak_memory_stats(cls, device: torch.device) -> None:
        raise NotImplementedError(f"{cls.name} keeps no allocator statistics")

    @classmethod
    def graph_pool_bytes(cls, decode_peak_bytes: int) -> int:
        """Memory the captured graphs' private pool will hold, from the activation peak of one
        eager decode step at the largest captured batch size (0 where nothing is captured)."""
        return 0

    @classmethod
    def inference_mode(cls) -> contextlib.AbstractContextManager:
        return torch.inference_mode()

    @classmethod
    def stream_context(cls) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @classmethod
    def new_event(cls, timing: bool = False) -> Any | None:
        """A device event (``record()``, ``synchronize()``; with ``timing``, ``elapsed_time(other)``
        in ms), or None where work is synchronous."""
        return None

    # -- graph capture primitives (platforms whose ``graph_capture`` replays device graphs) --
    @classmethod
    def new_graph(cls) -> Any:
        """An empty device graph to capture into (``replay()`` runs it)."""
        raise NotImplementedError(f"{cls.name} captures no device graphs ({cls.graph_capture})")

    @classmethod
    def graph_pool_handle(cls) -> Any:
        """A memory pool handle graphs captured one after another can share."""
        raise NotImplementedError(f"{cls.name} captures no device graphs ({cls.graph_capture})")

    @classmethod
    def graph_capture_context(cls, graph: Any, pool: Any = None) -> contextlib.AbstractContextManager:
        """Inside this context, device work is recorded into ``graph`` instead of run."""
        raise NotImplementedError(f"{cls.name} captures no device graphs ({cls.graph_capture})")

    # -- capabilities -------------------------------------------------------------------
    @classmethod
    def supported_dtypes(cls) -> tuple[torch.dtype, ...]:
        return cls._supported_dtypes

    @classmethod
    def resolve_auto_dtype(cls, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        """``dtype="auto"``: the checkpoint's dtype when supported, else the platform's first."""
        supported = cls.supported_dtypes()
        if checkpoint_dtype in supported and not (
            checkpoint_dtype == torch.float32 and cls.auto_casts_float32
        ):
            return checkpoint_dtype
        return supported[0]

    # -- choices ------------------------------------------------------------------------
    @classmethod
    def attn_backend_candidates(cls) -> tuple[str, ...]:
        return cls.attn_backend_priority

    @classmethod
    def get_attn_backend(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: str,
        block_size: int,
        forced: str | None = None,
    ) -> tuple[type[AttentionBackend], dict[str, list[str]]]:
        """Return (backend class, {skipped backend: reasons}).

        Walks ``attn_backend_candidates()`` and takes the first candidate that reports no
        reason it cannot run (a candidate whose required package is missing is not even
        imported). ``forced`` (or ``OCTAVO_ATTENTION_BACKEND``) picks one; if it cannot run,
        raise ``ValueError`` listing its reasons. If no candidate can run, raise ``ValueError``
        listing every candidate's reasons.
        """
        from octavo import envs

        forced = forced or envs.OCTAVO_ATTENTION_BACKEND
        if forced:
            backend = _load_backend(forced)
            reasons = [backend] if isinstance(backend, str) else cls._backend_reasons(
                backend, head_size, dtype, kv_cache_dtype, block_size
            )
            if reasons:
                raise ValueError(
                    f"attention backend {forced!r} (forced by OCTAVO_ATTENTION_BACKEND or the "
                    f"caller) cannot run on {cls.name} with head size {head_size}, dtype "
                    f"{_dtype_name(dtype)}, kv cache {kv_cache_dtype}, block size {block_size}: "
                    + "; ".join(reasons)
                )
            assert not isinstance(backend, str)
            return backend, {}
        skipped: dict[str, list[str]] = {}
        for name in cls.attn_backend_candidates():
            backend = _load_backend(name)
            if isinstance(backend, str):
                skipped[name] = [backend]
                continue
            reasons = cls._backend_reasons(backend, head_size, dtype, kv_cache_dtype, block_size)
            if not reasons:
                for n, r in skipped.items():
                    logger.info("attention backend %s skipped: %s", n, "; ".join(r))
                return backend, skipped
            skipped[name] = reasons
        detail = "; ".join(f"{n}: {', '.join(r)}" for n, r in skipped.items())
        raise ValueError(
            f"no attention backend of {cls.name} can run head size {head_size}, dtype "
            f"{_dtype_name(dtype)}, kv cache {kv_cache_dtype}, block size {block_size} ({detail})"
        )

    @classmethod
    def _backend_reasons(
        cls,
        backend: type[AttentionBackend],
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: str,
        block_size: int,
    ) -> list[str]:
        return backend.validate(head_size, dtype, kv_cache_dtype, block_size, platform=cls)

    @classmethod
    def get_graph_capture(cls, config: OctavoConfig | None = None) -> Choice:
        """How decode steps are captured for replay (one of ``GRAPH_CAPTURE_MODES``)."""
        if config is not None and config.enforce_eager and cls.graph_capture != "none":
            return Choice("none", "--enforce-eager")
        return Choice(cls.graph_capture, cls.graph_capture_reason)

    @classmethod
    def get_communicator(cls) -> Choice:
        """The collective library tensor parallelism uses on this platform."""
        return Choice(cls.communicator, cls.communicator_reason)

    @classmethod
    def get_dist_backend(cls) -> str:
        """The ``torch.distributed`` backend name for ``init_process_group``."""
        return cls.dist_backend

    @classmethod
    def check_and_update_config(cls, config: OctavoConfig) -> OctavoConfig:
        """The single hook for platform policy; returns a (possibly replaced) config.

        Validates what the platform cannot do (errors name the flag and the allowed values) and
        fills in platform defaults. Eager mode is recorded where the platform captures no graphs.
        """
        bs = config.cache_config.block_size
        if bs not in cls.supported_block_sizes:
            raise ValueError(
                f"--block-size (block_size) {bs} is not supported on {cls.name}; "
                f"supported: {list(cls.supported_block_sizes)}"
            )
        kvd = config.cache_config.kv_cache_dtype
        if kvd not in cls.supported_kv_cache_dtypes:
            raise ValueError(
                f"--kv-cache-dtype (kv_cache_dtype) {kvd!r} is not supported on {cls.name}; "
                f"supported: {list(cls.supported_kv_cache_dtypes)}"
            )
        dtype = config.model_config.dtype
        if dtype not in cls.supported_dtypes():
            raise ValueError(
                f"--dtype (dtype) {_dtype_name(dtype)} is not supported on {cls.name}; "
                f"supported: {[_dtype_name(d) for d in cls.supported_dtypes()]}"
            )
        tp = config.parallel_config.tensor_parallel_size
        if cls.device_type != "cpu" and tp > cls.device_count():
            raise ValueError(
                f"--tensor-parallel-size (tensor_parallel_size) {tp} needs {tp} {cls.name} "
                f"devices; {cls.device_count()} visible"
            )
        if cls.get_graph_capture(config).value == "none" and not config.enforce_eager:
            config = config.replace(enforce_eager=True)
        return config

    @classmethod
    def kv_cache_memory_bytes(cls, config: OctavoConfig, model_bytes: int, peak_bytes: int) -> int:
        """Bytes the KV cache may take, given weights and peak activation bytes."""
        free, total = cls.mem_get_info()
        budget = int(total * config.cache_config.gpu_memory_utilization) - (total - free) - peak_bytes
        return max(budget, 0)

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Facts for ``octavo info`` (extended by each platform)."""
        return {"device": cls.get_device_name(), "device count": str(cls.device_count())}


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _load_backend(name: str) -> type[AttentionBackend] | str:
    """The backend class, or why it cannot be loaded (missing package, import error)."""
    from octavo.attention import backends

    missing = backends.missing_packages(name)
    if missing:
        return "; ".join(f"package {m!r} is not installed" for m in missing)
    try:
        return _import_backend(name)
    except ImportError as e:
        return f"not importable ({e})"
    except (ValueError, AttributeError) as e:
        return str(e)


def _import_backend(name: str) -> type[AttentionBackend]:
    from octavo.attention.backends import resolve_backend

    return resolve_backend(name)
