"""msgpack encoding of driver <-> worker messages (no pickle between processes).

Dataclasses travel as dicts of their init fields; ``SamplingParams`` inside new requests is
rebuilt through its constructor (which re-validates it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from octavo.core.scheduler_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from octavo.sampling_params import SamplingParams


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    tolist = getattr(obj, "tolist", None)
    if tolist is not None:
        return tolist()
    raise TypeError(f"cannot msgpack-encode {type(obj).__name__}")


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


def _params_dict(p: SamplingParams) -> dict[str, Any]:
    return _fields(p)


def encode_scheduler_output(so: SchedulerOutput) -> dict[str, Any]:
    d = _fields(so)
    d["scheduled_new_reqs"] = [
        {**_fields(r), "sampling_params": _params_dict(r.sampling_params)} for r in so.scheduled_new_reqs
    ]
    d["scheduled_cached_reqs"] = [_fields(r) for r in so.scheduled_cached_reqs]
    return d


def decode_scheduler_output(d: dict[str, Any]) -> SchedulerOutput:
    new = []
    for r in d["scheduled_new_reqs"]:
        r = dict(r)
        r["sampling_params"] = SamplingParams(**r["sampling_params"])
        new.append(NewRequestData(**r))
    return SchedulerOutput(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=[CachedRequestData(**r) for r in d["scheduled_cached_reqs"]],
        num_scheduled_tokens=d["num_scheduled_tokens"],
        total_num_scheduled_tokens=d["total_num_scheduled_tokens"],
        finished_req_ids=set(d["finished_req_ids"]),
        preempted_req_ids=set(d["preempted_req_ids"]),
        **{k: v for k, v in d.items() if k not in _SO_CORE},
    )


_SO_CORE = {
    "scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
    "total_num_scheduled_tokens", "finished_req_ids", "preempted_req_ids",
}


def _tuple_dicts(x: Any) -> Any:
    """msgpack turns (logprob, rank) pairs into lists; turn every numeric pair back."""
    if isinstance(x, dict):
        return {k: _tuple_dicts(v) for k, v in x.items()}
    if isinstance(x, list):
        if len(x) == 2 and all(isinstance(v, (int, float)) for v in x):
            return tuple(x)
        return [_tuple_dicts(v) for v in x]
    return x


def encode_runner_output(out: ModelRunnerOutput) -> dict[str, Any]:
    return _fields(out)


def decode_runner_output(d: dict[str, Any]) -> ModelRunnerOutput:
    d = dict(d)
    if d.get("logprobs") is not None:
        d["logprobs"] = _tuple_dicts(d["logprobs"])
    if d.get("prompt_logprobs") is not None:
        d["prompt_logprobs"] = _tuple_dicts(d["prompt_logprobs"])
    return ModelRunnerOutput(**d)


def handle_call(worker: Any, method: str, arg: Any) -> Any:
    """Run one driver call on a worker; returns plain data (msgpack-encodable)."""
    if method == "execute_model":
        out = worker.execute_model(decode_scheduler_output(arg))
        return None if out is None else encode_runner_output(out)
    if method == "determine_num_blocks":
        return worker.determine_num_blocks()
    if method == "initialize_kv_cache":
        worker.initialize_kv_cache(arg)
        return None
    if method == "info":
        return worker.info()
    raise ValueError(f"unknown worker method {method!r}")
