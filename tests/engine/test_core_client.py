"""The engine-core client bounds what waits for its consumer: a consumer that takes no outputs
stops the engine process after a few steps (its output socket is full) instead of letting it
run on and pile decoded steps up in the API process; taking outputs again resumes it, and a
shutdown still stops an engine that is blocked on a full socket (it exits by itself, code 0).
The same for the engine on a thread (``InprocClient``): it blocks handing a batch over.

"Stopped" is read from the engine process's (thread's) CPU time in /proc (flat while it is blocked),
so the test waits for a state, not for a wall-clock interval.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from octavo.core.request import Request
from octavo.engine.arg_utils import EngineArgs
from octavo.engine.core_client import MAX_PENDING_BATCHES, InprocClient, MPClient
from octavo.sampling_params import SamplingParams

NUM_REQUESTS = 32
MAX_TOKENS = 400


def cpu_ticks(stat: Path) -> int:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def wait_cpu_flat(stat: Path, quiet_s: float = 1.0, deadline_s: float = 300.0) -> None:
    """Until the process (or thread) of ``stat`` has used no CPU for ``quiet_s`` (blocked or idle)."""
    deadline = time.monotonic() + deadline_s
    last, quiet_since = cpu_ticks(stat), time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        assert time.monotonic() < deadline, "the engine never stopped using CPU"
        await asyncio.sleep(0.1)
        now = cpu_ticks(stat)
        if now != last:
            last, quiet_since = now, time.monotonic()


def requests(tag: str) -> list[Request]:
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=20, temperature=1.0)
    return [Request(f"{tag}{i}", [5 + i, 6, 7], params, eos_token_id=None) for i in range(NUM_REQUESTS)]


async def drain_until_idle(client: MPClient) -> dict[str, int]:
    """Every output until the engine reports nothing running; new tokens per request."""
    got: dict[str, int] = {}
    while True:
        outputs, stats = await asyncio.wait_for(client.get_output(), 60)
        for o in outputs:
            got[o.request_id] = got.get(o.request_id, 0) + len(o.new_token_ids)
        if stats is not None and stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0:
            return got


def test_a_consumer_that_takes_no_outputs_stops_the_engine(llama_dir):
    async def main() -> None:
        args = EngineArgs(model=llama_dir, dtype="float32", max_model_len=2048, max_num_seqs=NUM_REQUESTS)
        client = MPClient(args.create_engine_config(), args)
        await client.start()
        try:
            stat = Path(f"/proc/{client.proc.pid}/stat")
            client.add_requests(requests("a"))
            await wait_cpu_flat(stat)  # blocked on its full output socket, or (unbounded) done
            assert client._queue.qsize() <= MAX_PENDING_BATCHES
            client.abort_requests([f"a{i}" for i in range(NUM_REQUESTS)])
            got = await drain_until_idle(client)
            # It stepped a few times past what was taken (the batches in the sockets: 14 on
            # Linux), then waited, nowhere near its 400 tokens (an unbounded engine runs them
            # all). Each step is one token per request.
            steps = max(got.values())
            assert steps < 100, f"the engine ran {steps} steps ahead of a consumer that took nothing"

            # blocked again, then shut down: it reads the SHUTDOWN once its outputs are discarded
            client.add_requests(requests("b"))
            await wait_cpu_flat(stat)
            await client.shutdown(timeout_s=60)
            assert client.proc.returncode == 0, "the engine had to be terminated"
        finally:
            await client.shutdown(timeout_s=5)

    asyncio.run(main())


def test_an_engine_thread_waits_for_its_consumer_too(llama_dir):
    """``OCTAVO_ENGINE_INPROC``: the engine thread blocks handing over a batch while
    ``MAX_PENDING_BATCHES`` wait, and a shutdown releases it."""

    async def main() -> None:
        args = EngineArgs(model=llama_dir, dtype="float32", max_model_len=2048, max_num_seqs=NUM_REQUESTS)
        client = InprocClient(args.create_engine_config())
        await client.start()
        try:
            stat = Path(f"/proc/self/task/{client._thread.native_id}/stat")
            client.add_requests(requests("a"))
            await wait_cpu_flat(stat)
            client.abort_requests([f"a{i}" for i in range(NUM_REQUESTS)])
            steps = max((await drain_until_idle(client)).values())
            assert steps <= MAX_PENDING_BATCHES + 3, f"the engine thread ran {steps} steps ahead"

            client.add_requests(requests("b"))
            await wait_cpu_flat(stat)
            await client.shutdown(timeout_s=60)
            assert not client._thread.is_alive()
        finally:
            await client.shutdown(timeout_s=5)

    asyncio.run(main())
