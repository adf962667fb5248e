"""The engine-core loop blocks while idle and never waits while it has work.

Checked on the loop's own decisions (the timeout of every ``recv``), not on CPU time over a
wall-clock interval: an idle engine waits ``IDLE_POLL_S`` for input, a busy one polls without
waiting, and it goes back to blocking as soon as its last request finishes.
"""

from __future__ import annotations

import pytest

from octavo.core.request import Request
from octavo.engine import serial
from octavo.engine.arg_utils import EngineArgs
from octavo.engine.core import EngineCore
from octavo.engine.core_proc import IDLE_POLL_S, EngineCoreLoop
from octavo.sampling_params import SamplingParams


class ScriptedLoop(EngineCoreLoop):
    """Feeds ``script[i]`` to the i-th ``recv`` call and records each call's timeout."""

    def __init__(self, core, script):
        super().__init__(core)
        self.script = list(script)
        self.timeouts: list[float] = []
        self.finished: list[str] = []

    def recv(self, timeout_s):
        self.timeouts.append(timeout_s)
        return self.script.pop(0) if self.script else [(serial.SHUTDOWN, None)]

    def send(self, outputs, stats):
        self.finished += [o.request_id for o in outputs if o.finish_reason is not None]


@pytest.fixture(scope="module")
def core(llama_dir):
    core = EngineCore(EngineArgs(model=llama_dir, dtype="float32", max_model_len=64).create_engine_config())
    yield core
    core.shutdown()


def test_idle_loop_blocks_on_every_receive(core):
    loop = ScriptedLoop(core, [[]] * 4)
    loop.run()
    assert IDLE_POLL_S > 0
    assert loop.timeouts == [IDLE_POLL_S] * 5  # four empty waits, then the shutdown


def test_busy_loop_polls_then_blocks_again(core):
    req = Request("r", [5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True), eos_token_id=None)
    loop = ScriptedLoop(core, [[(serial.ADD, req)], [], [], [], [], [], []])
    loop.run()
    assert loop.finished == ["r"]
    first_idle_after_work = loop.timeouts.index(IDLE_POLL_S, 1)
    assert loop.timeouts[0] == IDLE_POLL_S  # idle before the request arrived
    assert set(loop.timeouts[1:first_idle_after_work]) == {0.0}  # never waits while stepping
    assert set(loop.timeouts[first_idle_after_work:]) == {IDLE_POLL_S}  # blocks once done
    assert not core.has_unfinished_requests()
