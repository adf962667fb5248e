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
