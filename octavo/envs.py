"""Every environment variable octavo reads, with its default and meaning.

Read a variable as an attribute of this module (``octavo.envs.OCTAVO_PLATFORM``); the value
is looked up on each access so tests can ``monkeypatch.setenv`` freely. Nothing else in the
package calls ``os.environ`` for an ``OCTAVO_*`` name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def _str(name: str, default: str | None) -> Callable[[], str | None]:
    return lambda: os.environ.get(name, default)


def _float(name: str, default: float) -> Callable[[], float]:
    return lambda: float(os.environ.get(name, str(default)))


def _opt_float(name: str) -> Callable[[], float | None]:
    return lambda: float(os.environ[name]) if os.environ.get(name, "").strip() else None


def _opt_int(name: str) -> Callable[[], int | None]:
    def get() -> int | None:
        raw = os.environ.get(name, "").strip()
        if not raw:
            return None
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None

    return get


def _bool(name: str, default: bool) -> Callable[[], bool]:
    return lambda: os.environ.get(name, "1" if default else "0").strip().lower() in (
        "1",
        "true",
        "yes",
        "on",
    )


# name -> (getter, one-line description)
ENVIRONMENT_VARIABLES: dict[str, tuple[Callable[[], Any], str]] = {
    "OCTAVO_LOGGING_LEVEL": (_str("OCTAVO_LOGGING_LEVEL", "INFO"), "Log level of the octavo logger."),
    "OCTAVO_PLATFORM": (
        _str("OCTAVO_PLATFORM", None),
        "Force a platform by name (cpu, cuda, rocm, xpu, tpu or a plugin's name).",
    ),
    "OCTAVO_ATTENTION_BACKEND": (
        _str("OCTAVO_ATTENTION_BACKEND", None),
        "Force an attention backend by name (torch_ref, cpu_paged, triton_paged, ...).",
    ),
    "OCTAVO_MOE_BACKEND": (
        _str("OCTAVO_MOE_BACKEND", None),
        "Force the mixture-of-experts kernel by name (torch_ref, cpu_grouped, triton_grouped).",
    ),
    "OCTAVO_MOE_GEMV_MAX_PAIRS": (
        _opt_int("OCTAVO_MOE_GEMV_MAX_PAIRS"),
        "Most token-expert pairs the Triton MoE kernel runs as per-pair GEMVs instead of the "
        "grouped GEMM (unset: half the local experts, at least top-k; 0: never).",
    ),
    "OCTAVO_CPU_KVCACHE_SPACE": (
        _opt_float("OCTAVO_CPU_KVCACHE_SPACE"),
        "GiB of host memory for the KV cache on the CPU platform (unset: what max_num_seqs "
        "sequences of max_model_len tokens need, at most half the available memory).",
    ),
    "OCTAVO_CPU_ISA": (
        _str("OCTAVO_CPU_ISA", None),
        "Force the CPU kernel ISA variant: avx512, avx2, neon or scalar.",
    ),
    "OCTAVO_CPU_THREADS_BIND": (
        _str("OCTAVO_CPU_THREADS_BIND", "auto"),
        "CPU compute-thread placement: auto (one per physical core), a core list like 0-3, or none.",
    ),
    "OCTAVO_CPU_MALLOC_RETAIN": (
        _bool("OCTAVO_CPU_MALLOC_RETAIN", True),
        "CPU workers keep freed host memory for reuse (glibc mmap/trim thresholds pinned): a step's "
        "activations then reuse mapped pages instead of page-faulting fresh ones; 0: glibc's defaults.",
    ),
    "OCTAVO_CPU_GRAPH_MODE": (
        _str("OCTAVO_CPU_GRAPH_MODE", None),
        "CPU graph mode: torch_compile (decode steps run the model compiled by torch.compile / "
        "inductor) or none (eager); unset: the platform's default. --enforce-eager always wins.",
    ),
    "OCTAVO_MIXED_GRAPHS": (
        _bool("OCTAVO_MIXED_GRAPHS", False),
        "1: CUDA/HIP graphs also for mixed steps (prefill chunks among decodes, up to 16384 tokens, "
        "padded to captured token counts) with triton_paged; unset or 0: those steps run eagerly "
        "(decode steps replay graphs either way). Opt-in until its startup profile is re-run on a GPU.",
    ),
    "OCTAVO_DECODE_GEMV": (
        _str("OCTAVO_DECODE_GEMV", None),
        "Small-batch linears: GPU (<= 8 rows) auto (time the Triton GEMV against cuBLAS at load), "
        "table, or off; CPU (<= 4 rows, bf16) octavo's GEMV unless off.",
    ),
    "OCTAVO_CPU_INT8_ACTIVATIONS": (
        _bool("OCTAVO_CPU_INT8_ACTIVATIONS", False),
        "Weight-only INT8 / INT4 layers (int8, W8A16, W4A16, AWQ, GPTQ) on a CPU with AVX512-VNNI "
        "quantize activations per token to int8 and use integer dot products (like llama.cpp's "
        "q8_0 / q4_0): faster, but changes outputs. W8A8 checkpoints do this regardless. Set on a CPU "
        "without AVX512-VNNI and AVX512-VBMI it is an error.",
    ),
    "OCTAVO_CPU_INT8_LM_HEAD": (
        _bool("OCTAVO_CPU_INT8_LM_HEAD", False),
        "On the CPU, multiply bf16 hidden states with an INT8 per-channel copy of the output "
        "projection (lm_head, or the tied embedding) in octavo's C++ kernels: half the bytes per "
        "token (llama.cpp's q8_0 / q4_0 files quantize it too), slightly different logits. Off: "
        "the checkpoint's weight, as it is.",
    ),
    "OCTAVO_ENGINE_INPROC": (
        _bool("OCTAVO_ENGINE_INPROC", False),
        "Run the engine core inside the API process (debugging).",
    ),
    "OCTAVO_API_KEY": (_str("OCTAVO_API_KEY", None), "API key required by `octavo serve` on /v1."),
    "OCTAVO_DEFAULT_MODEL": (
        _str("OCTAVO_DEFAULT_MODEL", None),
        "Model used when none is given (defaults to the model shipped in the package).",
    ),
}


def __getattr__(name: str) -> Any:
    if name in ENVIRONMENT_VARIABLES:
        return ENVIRONMENT_VARIABLES[name][0]()
    raise AttributeError(f"module 'octavo.envs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(ENVIRONMENT_VARIABLES)
