"""The CPU platform: host memory for the KV cache, octavo's C++ paged kernels, gloo, torch.compile graphs."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import ClassVar

import torch

from octavo import envs
from octavo.platforms.interface import Choice, Platform

GiB = 1 << 30


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float32, torch.float16)
    attn_backend_priority = ("cpu_paged", "torch_ref")
    moe_backend_priority = ("cpu_grouped", "torch_ref")
    # The CPU graph mode (octavo/worker/cpu_graph.py): OCTAVO_CPU_GRAPH_MODE picks it per run.
    graph_capture = "none"
    # Eager by default: the compiled decode step measured no faster (the eager step is already
    # C++ kernels end to end: GEMV, paged attention, fused norm/rope/SiLU) and costs a compile.
    graph_capture_reason = "CPU runs eagerly by default (OCTAVO_CPU_GRAPH_MODE=torch_compile compiles decode steps)"
    cpu_graph_modes = ("none", "torch_compile")
    communicator = "gloo"
    communicator_reason = "CPU: gloo over shared memory and TCP"
    dist_backend = "gloo"
    default_block_size = 16
    fused_op_kernels = "cpu"
    decode_gemv = "table"  # octavo's bf16 GEMV for linears at <= 4 rows, <= 64 with AMX (OCTAVO_DECODE_GEMV=off: oneDNN)
    # fp8 checkpoints run emulated (weights dequantized, activations rounded through float8
    # casts): correct but not faster; online fp8 is refused (int8 is the CPU's online method).
    supported_quantization = ("awq", "compressed-tensors", "fp8", "gptq", "int8")
    supported_online_quantization = ("int8",)
    # int8 activations: INT8 W8A8 checkpoints always; weight-only ones only by opt-in
    # (OCTAVO_CPU_INT8_ACTIVATIONS); both need AVX512-VNNI, else the next candidate.
    quant_kernel_priority: ClassVar[dict[str, tuple[str, ...]]] = {
        "int": ("cpu_int_a8", "cpu_int"), "int8_w8a8": ("cpu_w8a8",),
    }

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None  # every machine has a CPU

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        from octavo.cpu_isa import cpu_name

        return cpu_name()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    @classmethod
    def mem_get_info(cls, device_id: int | None = None) -> tuple[int, int]:
        total = cls.get_device_total_memory()
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        return min(free, total), total

    @classmethod
    def get_cpu_isa(cls) -> tuple[str, str]:
        """(ISA, why): avx512, avx2, neon or scalar — the variant of the C++ kernels this
        process runs, or, when they cannot run, the best the CPU supports and why not."""
        from octavo import cpu_isa

        try:
            variant, why = cpu_isa.select_variant()
            return cpu_isa.isa_of(variant), f"{variant}: {why}"
        except (ImportError, ValueError) as e:
            isa, why = cpu_isa.best_isa()
            return isa, f"{why}; C++ kernels not in use: {e}"

    @classmethod
    def get_graph_capture(cls, config=None) -> Choice:
        """The platform default, or ``OCTAVO_CPU_GRAPH_MODE``; ``--enforce-eager`` wins over both."""
        mode = envs.OCTAVO_CPU_GRAPH_MODE
        if mode is None:
            return super().get_graph_capture(config)
        if mode not in cls.cpu_graph_modes:
            raise ValueError(f"OCTAVO_CPU_GRAPH_MODE must be one of {', '.join(cls.cpu_graph_modes)}, got {mode!r}")
        if config is not None and config.enforce_eager and mode != "none":
            return Choice("none", "--enforce-eager")
        return Choice(mode, "OCTAVO_CPU_GRAPH_MODE")

    @classmethod
    def setup_worker(cls, local_rank: int, world_size: int):
        """Pin this worker's compute threads (``OCTAVO_CPU_THREADS_BIND``) and keep freed host
        memory for reuse (``OCTAVO_CPU_MALLOC_RETAIN``); returns the plan."""
        from octavo.platforms.cpu_memory import retain_freed_memory
        from octavo.platforms.cpu_threads import setup_cpu_threads

        return {**setup_cpu_threads(local_rank, world_size), "malloc_retain": retain_freed_memory()}

    @classmethod
    def kv_cache_memory_bytes(cls, config, model_bytes: int, peak_bytes: int) -> int:
        """The KV cache gets ``cpu_kvcache_space_bytes`` of host memory (set by
        ``check_and_update_config``: ``OCTAVO_CPU_KVCACHE_SPACE`` or the workload's need)."""
        space = config.cache_config.cpu_kvcache_space_bytes
        return space if space is not None else cls.auto_kvcache_space_bytes(config)

    @classmethod
    def auto_kvcache_space_bytes(cls, config) -> int:
        """What ``max_num_seqs`` sequences of ``max_model_len`` tokens need (whole blocks, plus
        the null block 0 that holds no sequence's tokens), at most half the memory available now,
        and never less than one full-length sequence (so a too-small machine fails with the
        cache-size error that names the flags)."""
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        elem = torch.empty((), dtype=mc.dtype).element_size() if cc.kv_cache_dtype == "auto" else 1
        # Layer pages a token costs: every layer, or every group slot when layers form several
        # KV cache groups (their full-attention groups alone may need a block per token).
        groups = cc.kv_cache_groups
        pages = len(groups) * max(len(g.layers) for g in groups) if len(groups) > 1 else mc.num_layers
        per_token = 2 * pages * mc.kv_heads_per_rank(config.parallel_config.tensor_parallel_size)
        per_token *= mc.head_size * elem
        blocks_per_seq = -(-sc.max_model_len // cc.block_size)
        block = cc.block_size * per_token
        one_seq = (blocks_per_seq + 1) * block
        want = (sc.max_num_seqs * blocks_per_seq + 1) * block
        free, _ = cls.mem_get_info()
        return max(one_seq, min(want, free // 2))

    @classmethod
    def check_and_update_config(cls, config):
        config = super().check_and_update_config(config)
        if config.cache_config.cpu_kvcache_space_bytes is None:
            gib = envs.OCTAVO_CPU_KVCACHE_SPACE
            if gib is not None and gib <= 0:
                raise ValueError(f"OCTAVO_CPU_KVCACHE_SPACE must be > 0 GiB, got {gib}")
            space = int(gib * GiB) if gib is not None else cls.auto_kvcache_space_bytes(config)
            config = config.replace(cache_config=replace(config.cache_config, cpu_kvcache_space_bytes=space))
        return config

    @classmethod
    def linear_kernels(cls) -> str:
        """Which kernels bf16 linear layers run on (single rank)."""
        from octavo import cpu_isa

        try:
            ext = cpu_isa.load_extension()
        except ImportError as e:
            return f"oneDNN through torch (C++ CPU kernels unavailable: {e})"
        if not hasattr(ext, "gemv") or cls.decode_gemv_policy() == "off":
            return "oneDNN with prepacked weights"
        dot = ", VDPBF16PS" if ext.BF16_DOT else ""
        if getattr(ext, "gemv_amx", lambda: False)():
            return (f"octavo bf16 GEMV ({ext.ISA}{dot}; 2-64 rows on AMX tiles) at decode batch sizes, "
                    "oneDNN with prepacked weights above")
        rows = "1-64 rows" if ext.BF16_DOT else "1-4 rows"
        return f"octavo bf16 GEMV ({ext.ISA}{dot}; {rows}) at decode batch sizes, oneDNN with prepacked weights above"

    @classmethod
    def describe(cls) -> dict[str, str]:
        isa, why = cls.get_cpu_isa()
        return {
            "device": cls.get_device_name(),
            "cpu isa": f"{isa} ({why})",
            "linear kernels": cls.linear_kernels(),
            "threads": str(torch.get_num_threads()),
            "kv cache space": (
                f"{envs.OCTAVO_CPU_KVCACHE_SPACE:g} GiB (OCTAVO_CPU_KVCACHE_SPACE)"
                if envs.OCTAVO_CPU_KVCACHE_SPACE is not None
                else "auto: max_num_seqs x max_model_len, at most half the free memory "
                "(OCTAVO_CPU_KVCACHE_SPACE unset)"
            ),
        }
