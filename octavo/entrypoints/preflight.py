"""Checks of the command line and the machine that run before any engine starts.

Each raises ``ValueError`` with one line naming the flag, which ``octavo`` prints as
``error: ...`` and exits 2, seconds before loading a model would have found the same problem.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket

logger = logging.getLogger(__name__)

SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def check_prompts(prompts: list[str]) -> None:
    for i, p in enumerate(prompts, 1):
        if not p.strip():
            raise ValueError(f"prompt {i} of {len(prompts)} is empty: give some text to continue")


def sampling_overrides(args: argparse.Namespace) -> dict:
    """The sampling flags given on the command line (unset ones come from the model's
    generation_config.json, as in ``LLM.generate``)."""
    return {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k, None) is not None}


def check_sampling(args: argparse.Namespace) -> None:
    """Build the request's SamplingParams from the flags alone: its own range checks apply."""
    from octavo.sampling_params import SamplingParams

    try:
        SamplingParams(n=args.n, max_tokens=args.max_tokens, seed=args.sampling_seed,
                       ignore_eos=args.ignore_eos, **sampling_overrides(args))
    except ValueError as e:
        raise ValueError(str(e).replace("max_tokens", "--max-tokens (max_tokens)", 1)) from None


def check_port_free(host: str, port: int) -> None:
    """Bind and release ``host:port`` the way uvicorn will (SO_REUSEADDR)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be in [0, 65535]; got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"--host {host!r} cannot be resolved: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise ValueError(f"--port {port}: cannot listen on {host}:{port}: {e.strerror}") from None


def check_parallel(tensor_parallel_size: int) -> None:
    """TP size against what the platform has: devices, or cores on the CPU (one worker each)."""
    from octavo.platforms import current_platform

    if tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size must be >= 1; got {tensor_parallel_size}")
    if current_platform.device_is_host():  # the CPU: one worker process per core
        have = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        what = "CPU cores"
    else:
        have, what = current_platform.device_count(), f"{current_platform.name} devices"
    if tensor_parallel_size > have:
        raise ValueError(
            f"--tensor-parallel-size {tensor_parallel_size} needs {tensor_parallel_size} workers but this "
            f"machine has {have} {what} usable"
        )


def warn_ignored(args: argparse.Namespace) -> None:
    """Flags that are valid but have no effect on the resolved platform: say so once."""
    from octavo.platforms import current_platform

    if current_platform.device_is_host() and getattr(args, "gpu_memory_utilization", 0.9) != 0.9:
        logger.warning(
            "--gpu-memory-utilization has no effect on the CPU: the KV cache takes "
            "OCTAVO_CPU_KVCACHE_SPACE GiB of host memory (default: what the workload needs) instead"
        )


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_api_key(args: argparse.Namespace, env_key: str | None) -> str | None:
    """The key the server will require. An empty ``--api-key`` (say ``"$OCTAVO_API_KEY"`` with
    the variable unset) is an error; no key on a non-loopback host is a loud warning."""
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError(
            "--api-key is empty (an unset shell variable?): give a key, or leave the flag out to "
            "serve without authentication"
        )
    key = args.api_key or env_key or None
    if key is None and not is_loopback(args.host):
        logger.warning(
            "serving on %s with no API key: anyone who can reach this address can use the model "
            "(pass --api-key or set OCTAVO_API_KEY, or bind 127.0.0.1)", args.host,
        )
    return key
