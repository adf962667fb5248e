"""The msgpack messages between the API process and the engine core process round-trip."""

from __future__ import annotations

import msgpack
import pytest

from octavo.core.outputs import EngineCoreOutput, SchedulerStats
from octavo.core.request import Request
from octavo.engine import serial
from octavo.sampling_params import SamplingParams


def roundtrip(kind, payload):
    data = serial.pack(kind, payload)
    assert isinstance(msgpack.unpackb(data, strict_map_key=False), list)  # plain msgpack, no pickle
    k, p = serial.unpack(data)
    assert k == kind
    return p


def test_request_roundtrip():
    params = SamplingParams(
        n=1, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, seed=2**62, max_tokens=9, min_tokens=2,
        stop=["a", "bc"], stop_token_ids=[3], logprobs=2, logit_bias={5: -1.5, 7: 2.0},
        allowed_token_ids=[1, 2, 3, 5, 7], bad_words=["x"], ignore_eos=True,
    )
    params._bad_words_token_ids = [[4, 5]]
    req = Request("0_abc", [1, 2, 3], params, eos_token_id=0, arrival_time=12.5, priority=-3,
                  cache_salt="salt", parent_request_id="abc")
    back = serial.decode_request(roundtrip(serial.ADD, serial.encode_request(req)))
    assert back.request_id == "0_abc" and back.prompt_token_ids == [1, 2, 3]
    assert back.eos_token_id == 0 and back.arrival_time == 12.5 and back.priority == -3
    assert back.cache_salt == "salt" and back.parent_request_id == "abc"
    assert back.sampling_params == params
    assert back.sampling_params.logit_bias == {5: -1.5, 7: 2.0}
    assert back.sampling_params._bad_words_token_ids == [[4, 5]]


def test_outputs_and_stats_roundtrip():
    o = EngineCoreOutput("r", [5, 6], finish_reason="length", stop_reason=None,
                         new_logprobs=[{5: (-0.1, 1), 9: (-2.0, 2)}, {6: (-0.5, 1)}],
                         prompt_logprobs=[None, {3: (-1.0, 4)}], num_cached_tokens=16)
    back = serial.decode_output(roundtrip(serial.OUTPUTS, serial.encode_output(o)))
    assert back.request_id == "r" and back.new_token_ids == [5, 6] and back.finish_reason == "length"
    assert back.num_cached_tokens == 16
    for t, (lp, rank) in back.new_logprobs[0].items():  # tuples come back as lists; unpacking works
        assert (lp, rank) == o.new_logprobs[0][t]
    stats = SchedulerStats(num_running_reqs=2, kv_cache_usage=0.25, prefix_cache_queries=10, num_preemptions=1)
    assert serial.decode_stats(roundtrip(serial.OUTPUTS, serial.encode_stats(stats))) == stats
    assert serial.decode_stats(None) is None


def test_unencodable_values_are_refused():
    with pytest.raises(TypeError):
        serial.pack(serial.ADD, {"x": object()})


def test_scheduler_and_runner_outputs_roundtrip_without_engine_side_fields():
    """The driver -> worker boundary uses the same codec; engine-side references stay home."""
    import numpy as np

    from octavo.core.scheduler_output import (
        CachedRequestData,
        ModelRunnerOutput,
        NewRequestData,
        SchedulerOutput,
    )

    params = SamplingParams(temperature=0.5, seed=3, logprobs=1)
    req = Request("a", [1, 2, 3], params, eos_token_id=0)
    so = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData("a", [1, 2, 3], [], params, [[4, 5]], 0, eos_token_id=0)],
        scheduled_cached_reqs=[CachedRequestData("b", [[7]], 12)],
        num_scheduled_tokens={"a": 3, "b": 1},
        total_num_scheduled_tokens=4,
        finished_req_ids={"c"},
        preempted_req_ids={"d"},
        scheduled_requests={"a": req},
    )
    wire = serial.encode_scheduler_output(so)
    assert "scheduled_requests" not in wire
    back = serial.decode_scheduler_output(serial.decode(serial.encode(wire)))
    assert back == so  # scheduled_requests is compare=False
    assert back.scheduled_requests == {} and back.finished_req_ids == {"c"}
    assert back.scheduled_new_reqs[0].sampling_params == params
    out = ModelRunnerOutput(["a", "b"], [[5], []], logprobs=[[{5: (-0.25, 1)}], None],
                            prompt_logprobs={"a": (1, [{2: (-1.5, 3)}])})
    got = serial.decode_runner_output(serial.decode(serial.encode(serial.encode_runner_output(out))))
    assert got.req_ids == out.req_ids and got.sampled_token_ids == out.sampled_token_ids
    assert got.logprobs == out.logprobs and isinstance(got.logprobs[0][0][5], tuple)
    start, entries = got.prompt_logprobs["a"]  # the (start, entries) pair unpacks as before
    assert (start, entries) == (1, [{2: (-1.5, 3)}])
    assert serial.decode(serial.encode(np.int64(7))) == 7  # numpy scalars travel as numbers
