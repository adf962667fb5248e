"""Incremental detokenization, stop strings and output grouping (no model needed)."""

import pytest

from octavo.core.outputs import EngineCoreOutput
from octavo.core.request import Request
from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.engine.output_processor import OutputKind, OutputProcessor
from octavo.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def feed(tok, text: str, **params):
    """Detokenize ``text`` token by token; returns (detokenizer, deltas, matched stop)."""
    d = IncrementalDetokenizer(tok, SamplingParams(**params))
    deltas, stop = [], None
    for t in tok.encode(text, add_special_tokens=False):
        stop = d.update([t])
        assert "\ufffd" not in d.text
        deltas.append(d.get_delta(finished=stop is not None))
        if stop is not None:
            break
    if stop is None:
        d.finish(stopped_by_string=False)
        deltas.append(d.get_delta(finished=True))
    return d, deltas, stop


def test_multibyte_characters_split_across_tokens(tok):
    text = "漢字 and ñ and 🙂 then the end"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the fixture should split some character"
    d, deltas, _ = feed(tok, text)
    assert d.text == text == "".join(deltas)


def test_stop_string_cut_excluded_and_included(tok):
    text = "hello world, the cache is paged"
    d, deltas, stop = feed(tok, text, stop=["cache"])
    assert stop == "cache" and d.text == "hello world, the " == "".join(deltas)
    d, deltas, stop = feed(tok, text, stop=["cache", "world"], include_stop_str_in_output=True)
    assert stop == "world" and d.text == "hello world" == "".join(deltas)


def test_stop_string_spanning_tokens_is_held_back_and_never_retracted(tok):
    text = "data model token block cache batch engine"
    stop = "block cache"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(tok.encode(stop, add_special_tokens=False)) > 1
    d = IncrementalDetokenizer(tok, SamplingParams(stop=[stop]))
    shown = ""
    for t in ids:
        matched = d.update([t])
        shown += d.get_delta(finished=matched is not None)
        # Whatever a client has seen is final: a prefix of the text that will be returned.
        assert "data model token ".startswith(shown) or shown.startswith("data model token ")
        assert len(d.get_text(finished=False)) <= len(d.text)
        if matched:
            break
    assert matched == stop and shown == d.text == "data model token "


def test_include_stop_str_holds_nothing_back(tok):
    d = IncrementalDetokenizer(tok, SamplingParams(stop=["engine"], include_stop_str_in_output=True))
    ids = tok.encode("hello world", add_special_tokens=False)
    d.update(ids[:1])
    assert d.get_delta(finished=False) == "hello"


def test_skip_special_tokens(tok):
    ids = tok.encode("<|im_start|>user\nhello<|im_end|>", add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids
    for skip, expected in [(True, "user\nhello"), (False, "<|im_start|>user\nhello<|im_end|>")]:
        d = IncrementalDetokenizer(tok, SamplingParams(skip_special_tokens=skip))
        for t in ids:
            d.update([t])
        d.finish(stopped_by_string=False)
        assert d.text == expected


@pytest.mark.parametrize("skip", [True, False])
def test_final_only_decodes_once_at_finish_to_the_streamed_text(tok, skip):
    """An output read only once finished decodes nothing per token and ends with the text
    a streamed request ends with; stop strings keep it incremental (they must be matched)."""
    ids = tok.encode("<|im_start|>漢字 and ñ then 🙂<|im_end|>", add_special_tokens=False)
    params = SamplingParams(skip_special_tokens=skip)
    streamed, deferred = IncrementalDetokenizer(tok, params), IncrementalDetokenizer(tok, params, final_only=True)
    for t in ids:
        streamed.update([t])
        assert deferred.update([t]) is None and deferred.text == ""
    streamed.finish(stopped_by_string=False)
    deferred.finish(stopped_by_string=False)
    assert deferred.text == streamed.text == tok.decode(ids, skip_special_tokens=skip)
    assert deferred.token_ids == ids
    stopping = IncrementalDetokenizer(tok, SamplingParams(stop=["ñ"]), final_only=True)
    assert any(stopping.update([t]) == "ñ" for t in ids)


def test_output_processor_groups_children_and_finishes_on_stop_string(tok):
    op = OutputProcessor(tok)
    params = SamplingParams(n=2, stop=["world"], logprobs=0)
    children = [Request(f"{i}_r", [1, 2], params, 0, parent_request_id="r") for i in range(2)]
    op.add_request("r", "p", [1, 2], children, OutputKind.DELTA)
    hello, world = tok.encode("hello world", add_special_tokens=False)
    outs, abort = op.process_outputs([
        EngineCoreOutput("0_r", [hello], new_logprobs=[{hello: (-0.5, 1)}]),
        EngineCoreOutput("1_r", [hello], new_logprobs=[{hello: (-0.25, 2)}]),
    ])
    assert abort == [] and len(outs) == 1 and not outs[0].finished
    assert [c.index for c in outs[0].outputs] == [0, 1]
    # DELTA: "hello" minus the last len("world") - 1 characters, which might start "world".
    assert [c.text for c in outs[0].outputs] == ["h", "h"]
    outs, abort = op.process_outputs([
        EngineCoreOutput("1_r", [world], new_logprobs=[{world: (-1.0, 1)}]),
    ])
    assert abort == ["1_r"]  # the core must stop it: the stop string was found in text
    c1 = outs[0].outputs[1]
    assert c1.finish_reason == "stop" and c1.stop_reason == "world" and c1.text == "ello "
    assert c1.cumulative_logprob == pytest.approx(-1.25)
    outs, _ = op.process_outputs([EngineCoreOutput("0_r", [world], finish_reason="length")])
    assert outs[0].finished and not op.has_unfinished()
    assert outs[0].outputs[0].text == "ello "  # stop string cut, even with finish_reason set


def test_output_processor_accumulates_prompt_logprobs(tok):
    op = OutputProcessor(tok)
    req = Request("r", [5, 6, 7, 8], SamplingParams(prompt_logprobs=0), 0)
    op.add_request("r", None, [5, 6, 7, 8], [req], OutputKind.CUMULATIVE)
    op.process_outputs([EngineCoreOutput("r", [], prompt_logprobs=[{6: (-1.0, 3)}, {7: (-2.0, 1)}])])
    outs, _ = op.process_outputs([EngineCoreOutput("r", [9], finish_reason="length", prompt_logprobs=[{8: (-3.0, 2)}])])
    plp = outs[0].prompt_logprobs
    assert plp[0] is None and [list(d) for d in plp[1:]] == [[6], [7], [8]]
    assert plp[3][8].logprob == -3.0 and plp[3][8].rank == 2
