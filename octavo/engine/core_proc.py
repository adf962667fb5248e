"""The engine core's busy loop, and the engine core process that runs it when serving.

``EngineCoreLoop.run`` waits (blocking, no CPU) while the core has nothing to do; once it has
work it drains the input without blocking, runs one ``step`` and sends the outputs with a
scheduler-stats snapshot, over and over until the work is done. Stats are also sent when
they changed without any output (an abort freed blocks), so the API process always sees the
idle KV usage once the engine is idle.

Inputs: ``(ADD, Request)``, ``(ABORT, [ids])``, ``(PAUSE, [ids])``, ``(RESUME, [ids])``,
``(SHUTDOWN, None)``. With only paused requests left the loop idles like an empty engine. A request the scheduler
refuses (``ValueError``, e.g. it can never fit in the KV cache) comes back as an
``EngineCoreOutput`` with ``error`` set; the engine keeps running. Any other exception is a
bug: the process reports ``DEAD`` and exits, and the API process fails in-flight requests.

Backpressure: the output socket holds at most ``OUTPUT_HWM`` messages on each side (ZeroMQ's
high-water marks), so when the API process falls behind (detokenizing many samples with
logprobs on a loaded host) the loop blocks in ``send`` and steps no faster than the API
process takes its outputs: the backlog stays a few messages, not an unbounded pile of steps
in either process's memory.

Liveness: a thread of the engine process sends ``(HEARTBEAT, {"steps", "step_s"})`` every
``--heartbeat-interval`` seconds: how many steps have completed and for how long the step in
progress (if any) has been running. The API process declares the engine hung when heartbeats
stop (process stopped, e.g. SIGSTOP) or one step runs past its ``--engine-timeout``; a long
prefill is many bounded steps (chunked prefill), each one progress.

The process (``python -m octavo.engine.core_proc``) gets its ``EngineArgs`` as JSON on the
command line, connects to two ZeroMQ sockets the API process bound (PULL for input, PUSH for
output) and speaks msgpack only (``octavo.engine.serial``). It ignores SIGINT (the API process
owns Ctrl-C and tells it to stop), and exits when its parent goes away.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from octavo.core.outputs import EngineCoreOutput, SchedulerStats
from octavo.engine import serial
from octavo.engine.core import EngineCore

logger = logging.getLogger(__name__)

IDLE_POLL_S = 1.0  # how often an idle engine checks that its parent is alive
OUTPUT_HWM = 4  # messages the output socket queues on each side before the engine's send blocks


class EngineCoreLoop:
    """Transport-agnostic loop; subclasses implement ``recv``, ``send`` and ``parent_alive``."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.steps = 0  # completed steps (read by the heartbeat thread)
        self.step_started: float | None = None  # monotonic start of the step in progress

    def recv(self, timeout_s: float) -> list[tuple[str, Any]]:
        """Every message available; waits up to ``timeout_s`` for the first (0: no wait)."""
        raise NotImplementedError

    def send(self, outputs: list[EngineCoreOutput], stats: SchedulerStats) -> None:
        raise NotImplementedError

    def parent_alive(self) -> bool:
        return True

    def run(self) -> None:
        core = self.core
        last_stats: SchedulerStats | None = None
        while True:
            idle = not core.has_work()
            msgs = self.recv(IDLE_POLL_S if idle else 0.0)
            if idle and not msgs:
                if not self.parent_alive():
                    logger.info("API process is gone; engine core exits")
                    return
                continue
            errors: list[EngineCoreOutput] = []
            for kind, payload in msgs:
                if kind == serial.SHUTDOWN:
                    return
                if kind == serial.ADD:
                    try:
                        core.add_request(payload)
                    except ValueError as e:
                        errors.append(
                            EngineCoreOutput(payload.request_id, [], finish_reason="abort", error=str(e))
                        )
                elif kind == serial.ABORT:
                    core.abort_requests(list(payload))
                elif kind == serial.PAUSE:
                    core.pause_requests(list(payload))
                elif kind == serial.RESUME:
                    core.resume_requests(list(payload))
                else:
                    logger.warning("engine core ignores unknown message %r", kind)
            outputs: list[EngineCoreOutput] = []
            if core.has_work():
                self.step_started = time.monotonic()
                outputs = core.step()
                self.steps += 1
                self.step_started = None
            stats = core.stats()
            if errors or outputs or stats != last_stats:
                self.send(errors + outputs, stats)
                last_stats = stats


    def heartbeat(self) -> dict[str, Any]:
        started = self.step_started
        return {"steps": self.steps, "step_s": None if started is None else time.monotonic() - started}


class ZmqEngineCoreLoop(EngineCoreLoop):
    def __init__(
        self, core: EngineCore, in_sock, out_sock, parent_pid: int, heartbeat_interval_s: float = 1.0
    ) -> None:
        import zmq

        super().__init__(core)
        self.zmq = zmq
        self.in_sock = in_sock
        self.out_sock = out_sock
        self.parent_pid = parent_pid
        self.poller = zmq.Poller()
        self.poller.register(in_sock, zmq.POLLIN)
        self._send_lock = threading.Lock()  # the heartbeat thread shares the output socket
        self._stop = threading.Event()
        self._interval = heartbeat_interval_s

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            data = serial.pack(serial.HEARTBEAT, self.heartbeat())
            with self._send_lock:
                self.out_sock.send(data)

    def run(self) -> None:
        beat = threading.Thread(target=self._beat, name="octavo-heartbeat", daemon=True)
        beat.start()
        try:
            super().run()
        finally:
            self._stop.set()
            beat.join()

    def recv(self, timeout_s: float) -> list[tuple[str, Any]]:
        msgs = []
        if timeout_s > 0 and not self.poller.poll(int(timeout_s * 1000)):
            return msgs
        while True:
            try:
                data = self.in_sock.recv(self.zmq.NOBLOCK)
            except self.zmq.Again:
                return msgs
            kind, payload = serial.unpack(data)
            if kind == serial.ADD:
                payload = serial.decode_request(payload)
            msgs.append((kind, payload))

    def send(self, outputs: list[EngineCoreOutput], stats: SchedulerStats) -> None:
        payload = {
            "outputs": [serial.encode_output(o) for o in outputs],
            "stats": serial.encode_stats(stats),
        }
        data = serial.pack(serial.OUTPUTS, payload)
        with self._send_lock:
            self.out_sock.send(data)

    def parent_alive(self) -> bool:
        return os.getppid() == self.parent_pid


def engine_facts(core: EngineCore) -> dict[str, Any]:
    """What the API process learns at the READY handshake."""
    kv = core.scheduler.kv_cache_manager
    return {
        "pid": os.getpid(),
        "num_blocks": kv.num_usable_blocks,
        "block_size": kv.block_size,
        "kv_cache_tokens": kv.max_num_tokens,  # the longest sequence one request can hold
    }


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM us when the parent dies (best effort; polling covers the rest)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def main(argv: list[str] | None = None) -> int:
    import zmq

    from octavo.engine.arg_utils import EngineArgs
    from octavo.logger import configure_logging

    parser = argparse.ArgumentParser(prog="octavo-engine-core")
    parser.add_argument("--input-addr", required=True)
    parser.add_argument("--output-addr", required=True)
    parser.add_argument("--engine-args", required=True, help="EngineArgs as a JSON object")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--heartbeat-interval", type=float, default=1.0,
                        help="seconds between liveness messages to the API process")
    args = parser.parse_args(argv)

    configure_logging()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if os.getppid() != args.parent_pid:
        return 1

    ctx = zmq.Context()
    in_sock = ctx.socket(zmq.PULL)
    in_sock.connect(args.input_addr)
    out_sock = ctx.socket(zmq.PUSH)
    out_sock.setsockopt(zmq.SNDHWM, OUTPUT_HWM)
    out_sock.connect(args.output_addr)
    rc = 0
    try:
        try:
            engine_args = EngineArgs(**json.loads(args.engine_args))
            core = EngineCore(engine_args.create_engine_config())
        except Exception as e:
            logger.exception("engine core failed to start")
            out_sock.send(serial.pack(serial.DEAD, {"error": f"engine core failed to start: {e}"}))
            return 1
        out_sock.send(serial.pack(serial.READY, engine_facts(core)))
        try:
            ZmqEngineCoreLoop(core, in_sock, out_sock, args.parent_pid, args.heartbeat_interval).run()
        except Exception as e:
            logger.error("engine core loop failed:\n%s", traceback.format_exc())
            out_sock.send(serial.pack(serial.DEAD, {"error": f"engine core failed: {e!r}"}))
            rc = 1
    finally:
        in_sock.close(linger=0)
        out_sock.close(linger=2000)
        ctx.term()
    return rc


if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown of torch & co. (seconds on a busy host): every socket is
    # closed and nothing else needs flushing but the log streams.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
