"""The one msgpack codec of everything that crosses a process boundary (no pickle anywhere).

Two boundaries use it: API process <-> engine core process (ZeroMQ) and executor driver <->
worker processes or Ray actors (pipes). A message is a msgpack array ``[kind, payload]`` of
plain values (``pack``/``unpack``); ``encode``/``decode`` do single values. Dataclasses travel
as dicts of their *wire fields*: the init fields, minus those marked
``field(metadata={"wire": False})`` (engine-side references such as
``SchedulerOutput.scheduled_requests``), so a field added to them travels without a change here
as long as its value is plain data (numbers, strings, lists, dicts, None).

Engine kinds, API -> core: ``add`` (a request), ``abort`` (request ids), ``shutdown``.
Core -> API: ``ready`` (engine facts), ``outputs`` (EngineCoreOutputs + SchedulerStats),
``dead`` (the engine loop failed; the process exits right after), ``heartbeat`` (liveness:
steps completed and how long the current step has run, sent from a thread every interval).
Worker kinds: a method name with its argument, answered by ``ok`` (the result) or ``error``
(the traceback text).
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
from octavo.core.scheduler_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from octavo.sampling_params import SamplingParams

ADD = "add"
ABORT = "abort"
PAUSE = "pause"  # [ids]: stop scheduling them (their consumer is not reading)
RESUME = "resume"  # [ids]
SHUTDOWN = "shutdown"
READY = "ready"
OUTPUTS = "outputs"
DEAD = "dead"
HEARTBEAT = "heartbeat"


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # nested, e.g. StructuredOutputsParams
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
    tolist = getattr(obj, "tolist", None)  # numpy / torch scalars and arrays
    if tolist is not None:
        return tolist()
    raise TypeError(f"cannot msgpack-encode {type(obj).__name__}")


def encode(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def pack(kind: str, payload: Any = None) -> bytes:
    return encode([kind, payload])


def unpack(data: bytes) -> tuple[str, Any]:
    kind, payload = decode(data)
    return kind, payload


def wire_fields(obj: Any) -> dict[str, Any]:
    """The dataclass fields that travel: init fields not marked ``metadata={"wire": False}``."""
    return {
        f.name: getattr(obj, f.name)
        for f in dataclasses.fields(obj)
        if f.init and f.metadata.get("wire", True)
    }




# -- SamplingParams / Request -----------------------------------------------------------------
def encode_sampling_params(params: SamplingParams) -> dict[str, Any]:
    return wire_fields(params)


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
    return wire_fields(o)


def decode_output(d: dict[str, Any]) -> EngineCoreOutput:
    return EngineCoreOutput(**d)


def encode_stats(s: SchedulerStats | None) -> dict[str, Any] | None:
    return None if s is None else wire_fields(s)


def decode_stats(d: dict[str, Any] | None) -> SchedulerStats | None:
    return None if d is None else SchedulerStats(**d)


# -- SchedulerOutput / ModelRunnerOutput (driver <-> workers) -------------------------------
def encode_scheduler_output(so: SchedulerOutput) -> dict[str, Any]:
    d = wire_fields(so)
    d["scheduled_new_reqs"] = [
        {**wire_fields(r), "sampling_params": encode_sampling_params(r.sampling_params)}
        for r in so.scheduled_new_reqs
    ]
    d["scheduled_cached_reqs"] = [wire_fields(r) for r in so.scheduled_cached_reqs]
    return d


def decode_scheduler_output(d: dict[str, Any]) -> SchedulerOutput:
    """Rebuilds ``SamplingParams`` through its constructor, which re-validates them."""
    d = dict(d)
    d["scheduled_new_reqs"] = [
        NewRequestData(**{**r, "sampling_params": decode_sampling_params(r["sampling_params"])})
        for r in d["scheduled_new_reqs"]
    ]
    d["scheduled_cached_reqs"] = [CachedRequestData(**r) for r in d["scheduled_cached_reqs"]]
    d["finished_req_ids"] = set(d["finished_req_ids"])
    d["preempted_req_ids"] = set(d["preempted_req_ids"])
    return SchedulerOutput(**d)


def _tuple_pairs(x: Any) -> Any:
    """msgpack turns (logprob, rank) pairs into lists; turn every numeric pair back."""
    if isinstance(x, dict):
        return {k: _tuple_pairs(v) for k, v in x.items()}
    if isinstance(x, list):
        if len(x) == 2 and all(isinstance(v, (int, float)) for v in x):
            return tuple(x)
        return [_tuple_pairs(v) for v in x]
    return x


def encode_runner_output(out: ModelRunnerOutput) -> dict[str, Any]:
    return wire_fields(out)


def decode_runner_output(d: dict[str, Any]) -> ModelRunnerOutput:
    d = dict(d)
    for key in ("logprobs", "prompt_logprobs"):
        if d.get(key) is not None:
            d[key] = _tuple_pairs(d[key])
    return ModelRunnerOutput(**d)
