"""``OutputBuffer``: a consumer that does not read holds one merged output, not a queue."""

from __future__ import annotations

import asyncio

import pytest

from octavo.engine.output_buffer import ClientStalledError, OutputBuffer, merge_delta
from octavo.engine.output_processor import OutputKind
from octavo.outputs import CompletionOutput, Logprob, RequestOutput


def out(samples: dict[int, list[int]], finished: bool = False, plp=None) -> RequestOutput:
    return RequestOutput(
        request_id="r", prompt="p", prompt_token_ids=[1, 2],
        outputs=[CompletionOutput(index=i, text="".join(f"<{t}>" for t in ids), token_ids=ids,
                                  logprobs=[{t: Logprob(-1.0)} for t in ids]) for i, ids in samples.items()],
        finished=finished, prompt_logprobs=plp,
    )


def test_merge_delta_concatenates_per_sample():
    merged = merge_delta(out({0: [1], 1: [2]}, plp=[None]), out({1: [3, 4]}, plp=[{5: Logprob(-2.0)}]))
    assert [c.token_ids for c in merged.outputs] == [[1], [2, 3, 4]]
    assert [c.text for c in merged.outputs] == ["<1>", "<2><3><4>"]
    assert [len(c.logprobs) for c in merged.outputs] == [1, 3]
    assert merged.prompt_logprobs == [None, {5: Logprob(-2.0)}]


def test_buffer_holds_one_output_counts_unsent_and_marks_stall():
    async def run():
        buf = OutputBuffer(OutputKind.DELTA, max_unsent_tokens=4)
        for t in range(3):
            buf.put(out({0: [t]}))
        assert buf.unsent_tokens == 3 and buf.stalled_since is None
        buf.put(out({0: [7, 8]}))
        assert buf.unsent_tokens == 5 and buf.stalled_since is not None
        got = await buf.get()
        assert got.outputs[0].token_ids == [0, 1, 2, 7, 8]
        assert buf.unsent_tokens == 0 and buf.stalled_since is None
        buf.put(out({0: [9]}, finished=True))
        buf.put_error(ClientStalledError("stalled"))  # a stalled consumer gets the error at once
        with pytest.raises(ClientStalledError):
            await buf.get()

    asyncio.run(run())


def test_final_only_replaces():
    async def run():
        buf = OutputBuffer(OutputKind.FINAL_ONLY, max_unsent_tokens=100)
        buf.put(out({0: [1]}))
        buf.put(out({0: [1, 2]}, finished=True))
        assert (await buf.get()).outputs[0].token_ids == [1, 2]

    asyncio.run(run())
