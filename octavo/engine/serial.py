"""msgpack encoding of what crosses the API process <-> engine core process boundary.

No pickle on any socket: every message is a msgpack array ``[kind, payload]`` of plain
values. Dataclasses (``SamplingParams``, ``EngineCoreOutput``, ``SchedulerStats``) travel as
dicts of their init fields, so a field added to them travels without a change here as long
as its value is plain data (numbers, strings, lists, dicts, None).

Kinds, API -> core: ``add`` (a request), ``abort`` (request ids), ``shutdown``.
Core -> API: ``ready`` (engine facts), ``outputs`` (EngineCoreOutputs + SchedulerStats),
``dead`` (the engine loop failed; the process exits right after).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
from typing import Any

import msgpack

from octavo.core.outputs import EngineCoreOutput, SchedulerStats
from octavo.core.request import Request
from octavo.sampling_params import SamplingParams

ADD = "add"
ABORT = "abort"
SHUTDOWN = "shutdown"
READY = "ready"
OUTPUTS = "outputs"
DEAD = "dead"


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    tolist = getattr(obj, "tolist", None)  # numpy / torch scalars and arrays
    if tolist is not None:
        return tolist()
    raise TypeError(f"cannot msgpack-encode {type(obj).__name__}")


def pack(kind: str, payload: Any = None) -> bytes:
    return msgpack.packb([kind, payload], default=_default, use_bin_type=True)


def unpack(data: bytes) -> tuple[str, Any]:
    kind, payload = msgpack.unpackb(data, raw=False, strict_map_key=False)
    return kind, payload


def _init_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


# -- SamplingParams / Request -----------------------------------------------------------------
def encode_sampling_params(params: SamplingParams) -> dict[str, Any]:
    return _init_fields(params)


def decode_sampling_params(d: dict[str, Any]) -> SamplingParams:
    return SamplingParams(**d)


@functools.cache
def _request_init_params() -> tuple[str, ...]:
    sig = inspect.signature(Request.__init__)
    return tuple(name for name in sig.parameters if name != "self")


def encode_request(req: Request) -> dict[str, Any]:
    """Every ``Request.__init__`` argument, read back from the attribute of the same name.

    ``arrival_time`` is ``time.monotonic()``; CLOCK_MONOTONIC is system-wide on Linux, so it
    means the same in the engine process.
    """
    d = {name: getattr(req, name) for name in _request_init_params()}
    d["sampling_params"] = encode_sampling_params(req.sampling_params)
    return d


def decode_request(d: dict[str, Any]) -> Request:
    d = dict(d)
    d["sampling_params"] = decode_sampling_params(d["sampling_params"])
    return Request(**d)


# -- EngineCoreOutput / SchedulerStats -----------------------------------------------------
def encode_output(o: EngineCoreOutput) -> dict[str, Any]:
    return _init_fields(o)


def decode_output(d: dict[str, Any]) -> EngineCoreOutput:
    return EngineCoreOutput(**d)


def encode_stats(s: SchedulerStats | None) -> dict[str, Any] | None:
    return None if s is None else _init_fields(s)


def decode_stats(d: dict[str, Any] | None) -> SchedulerStats | None:
    return None if d is None else SchedulerStats(**d)
