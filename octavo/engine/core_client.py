"""Clients of the engine core, used by ``AsyncLLM`` from inside an asyncio event loop.

- ``MPClient`` starts the engine core in its own process (``octavo.engine.core_proc``) and
  talks to it over two ZeroMQ ipc sockets with msgpack messages; the API process does HTTP,
  tokenization and detokenization while the engine steps. It notices the engine process
  dying (exit, crash, SIGKILL) within ``WATCH_INTERVAL_S``, and the engine hanging (no
  heartbeat, e.g. SIGSTOP, or one step running) for longer than ``engine_timeout_s``; a hung
  engine process is killed. A long prefill is never mistaken for a hang: it is many steps,
  and every completed step is progress.
- ``InprocClient`` runs the same loop in a thread of the API process
  (``OCTAVO_ENGINE_INPROC=1``, for debugging); objects are passed without encoding.

Both deliver ``(outputs, stats)`` batches through ``get_output()``, which raises
``EngineDeadError`` once the engine is gone. At most ``MAX_PENDING_BATCHES`` decoded batches
wait for the consumer; past that the reader stops taking messages, the transport's bound
(``core_proc.OUTPUT_HWM`` for the process, a blocking hand-over for the thread) fills and the
engine waits. A consumer slower than the engine (many samples with logprobs on a loaded host)
so slows the engine down instead of piling up decoded steps in this process, whose memory the
allocator would keep after the pile is gone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import octavo
from octavo.config import OctavoConfig
from octavo.core.outputs import EngineCoreOutput, SchedulerStats
from octavo.core.request import Request
from octavo.engine import serial
from octavo.engine.arg_utils import EngineArgs
from octavo.engine.core_proc import OUTPUT_HWM, EngineCoreLoop, engine_facts

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.2
DEFAULT_ENGINE_TIMEOUT_S = 60.0
MAX_PENDING_BATCHES = 2  # decoded output batches waiting for ``get_output``

OutputBatch = tuple[list[EngineCoreOutput], SchedulerStats | None]


class EngineDeadError(RuntimeError):
    """The engine core stopped (crashed, was killed, or failed); no request can be served."""


class EngineStartupError(RuntimeError):
    """The engine core could not start (its process logged why)."""


class EngineCoreClient(ABC):
    def __init__(self) -> None:
        self.engine_info: dict[str, Any] = {}
        self.dead_reason: str | None = None
        self.dead_event = asyncio.Event()
        self._closing = False
        self._queue: asyncio.Queue | None = None

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    def add_requests(self, requests: list[Request]) -> None: ...

    @abstractmethod
    def abort_requests(self, request_ids: list[str]) -> None: ...

    def pause_requests(self, request_ids: list[str]) -> None:
        """Stop scheduling them (their consumer is not reading); they keep their place."""
        self._control(serial.PAUSE, request_ids)

    def resume_requests(self, request_ids: list[str]) -> None:
        self._control(serial.RESUME, request_ids)

    @abstractmethod
    def _control(self, kind: str, request_ids: list[str]) -> None:
        """Send a PAUSE/RESUME message for ``request_ids`` (nothing when empty)."""

    @abstractmethod
    async def shutdown(self, timeout_s: float = 5.0) -> None: ...

    def _mark_dead(self, reason: str) -> None:
        if self.dead_reason is None and not self._closing:
            logger.error("engine core is dead: %s", reason)
            self.dead_reason = reason
            self.dead_event.set()
            assert self._queue is not None
            if not self._queue.full():  # wake a waiting consumer; a full one finds out when it drains
                self._queue.put_nowait(EngineDeadError(reason))

    async def get_output(self) -> OutputBatch:
        """The next batch of outputs; raises ``EngineDeadError`` once the engine is gone."""
        assert self._queue is not None, "start() first"
        if self.dead_reason is not None and self._queue.empty():
            raise EngineDeadError(self.dead_reason)
        item = await self._queue.get()
        if isinstance(item, EngineDeadError):
            raise item
        return item


class MPClient(EngineCoreClient):
    """Engine core in a child process; ZeroMQ PUSH (requests) / PULL (outputs), msgpack."""

    def __init__(
        self, config: OctavoConfig, engine_args: EngineArgs, engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    ) -> None:
        super().__init__()
        if not engine_timeout_s > 0:
            raise ValueError(f"--engine-timeout must be > 0 seconds; got {engine_timeout_s}")
        self.engine_timeout_s = engine_timeout_s
        self.heartbeat_interval_s = min(1.0, engine_timeout_s / 4)
        self._last_heard = 0.0  # monotonic time of the last message from the engine
        mc = config.model_config
        # The child rebuilds the same config from the already-resolved model folder.
        self.engine_args = dataclasses.replace(
            engine_args, model=mc.model, tokenizer=mc.tokenizer, served_model_name=mc.served_model_name
        )
        self.proc: subprocess.Popen | None = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._queue = asyncio.Queue(MAX_PENDING_BATCHES)
        self._dir = tempfile.mkdtemp(prefix="octavo-")
        in_addr, out_addr = f"ipc://{self._dir}/input", f"ipc://{self._dir}/output"
        self._ctx = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self.input = self._ctx.socket(zmq.PUSH)
        self.input.setsockopt(zmq.SNDHWM, 0)  # never block the event loop on send
        self.input.setsockopt(zmq.LINGER, 0)
        self.input.bind(in_addr)
        self.output = self._actx.socket(zmq.PULL)
        self.output.setsockopt(zmq.LINGER, 0)
        self.output.setsockopt(zmq.RCVHWM, OUTPUT_HWM)
        self.output.bind(out_addr)
        cmd = [
            sys.executable, "-m", "octavo.engine.core_proc",
            "--input-addr", in_addr, "--output-addr", out_addr,
            "--engine-args", json.dumps(dataclasses.asdict(self.engine_args)),
            "--parent-pid", str(os.getpid()),
            "--heartbeat-interval", str(self.heartbeat_interval_s),
        ]  # fmt: skip
        # The child imports octavo from wherever this process did (a source checkout too).
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(octavo.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)
        try:
            await self._wait_ready()
        except BaseException:
            await self.shutdown(timeout_s=1.0)
            raise
        self._last_heard = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._read_loop(), name="octavo-engine-reader"),
            asyncio.create_task(self._watch(), name="octavo-engine-watch"),
        ]

    async def _wait_ready(self) -> None:
        assert self.proc is not None
        while True:
            if await self.output.poll(int(WATCH_INTERVAL_S * 1000)):
                kind, payload = serial.unpack(await self.output.recv())
                if kind == serial.READY:
                    self.engine_info = payload
                    return
                if kind == serial.DEAD:
                    raise EngineStartupError(payload["error"])
            elif self.proc.poll() is not None:
                raise EngineStartupError(
                    f"the engine core process exited with code {self.proc.returncode} during startup"
                )

    async def _read_loop(self) -> None:
        assert self._queue is not None
        try:
            while True:
                kind, payload = serial.unpack(await self.output.recv())
                self._last_heard = time.monotonic()
                if kind == serial.OUTPUTS:
                    outputs = [serial.decode_output(d) for d in payload["outputs"]]
                    await self._queue.put((outputs, serial.decode_stats(payload["stats"])))
                elif kind == serial.HEARTBEAT:
                    step_s = payload.get("step_s")
                    if step_s is not None and step_s > self.engine_timeout_s:
                        self._hung(f"one engine step has run for {step_s:.1f}s (--engine-timeout "
                                   f"{self.engine_timeout_s:g}s) after {payload.get('steps')} steps")
                        return
                elif kind == serial.DEAD:
                    self._mark_dead(payload["error"])
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a socket closed under us, undecodable data
            if not self._closing:
                self._mark_dead(f"lost the engine core connection: {e!r}")

    async def _watch(self) -> None:
        assert self.proc is not None
        while self.proc.poll() is None:
            await asyncio.sleep(WATCH_INTERVAL_S)
            silent = time.monotonic() - self._last_heard
            if silent > self.engine_timeout_s and self.proc.poll() is None:
                self._hung(f"no heartbeat from the engine core for {silent:.1f}s (--engine-timeout "
                           f"{self.engine_timeout_s:g}s): it is stopped or hung")
                return
        self._mark_dead(f"the engine core process (pid {self.proc.pid}) exited with code {self.proc.returncode}")

    def _hung(self, reason: str) -> None:
        """Declare the engine dead and kill its process (a stopped process dies on SIGKILL)."""
        self._mark_dead(reason)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def _send(self, data: bytes) -> None:
        if self.is_dead or self._closing:
            return
        self.input.send(data)

    def add_requests(self, requests: list[Request]) -> None:
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        for r in requests:
            self._send(serial.pack(serial.ADD, serial.encode_request(r)))

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._send(serial.pack(serial.ABORT, list(request_ids)))

    def _control(self, kind: str, request_ids: list[str]) -> None:
        if request_ids and not self.is_dead:
            self._send(serial.pack(kind, list(request_ids)))

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._closing:
            return
        try:
            self._send(serial.pack(serial.SHUTDOWN))
        except Exception:
            pass
        self._closing = True
        for t in self._tasks:
            t.cancel()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while proc.poll() is None and loop.time() < deadline:
                # discard its outputs: an engine blocked on a full output socket reads no SHUTDOWN
                if await self.output.poll(50):
                    await self.output.recv()
            if proc.poll() is None:
                logger.warning("engine core did not stop in %.1fs; terminating it", timeout_s)
                proc.terminate()
                try:
                    await asyncio.wait_for(asyncio.to_thread(proc.wait), 3.0)
                except asyncio.TimeoutError:
                    proc.kill()
                    await asyncio.to_thread(proc.wait)
        self.input.close()
        self.output.close()
        self._ctx.term()
        self._actx.term()
        shutil.rmtree(self._dir, ignore_errors=True)


class QueueEngineCoreLoop(EngineCoreLoop):
    """The engine loop on a thread: a ``queue.Queue`` in, a callback out (no encoding)."""

    def __init__(self, core, inbox: queue.Queue, deliver: Callable[[OutputBatch], None]) -> None:
        super().__init__(core)
        self.inbox = inbox
        self.deliver = deliver

    def recv(self, timeout_s: float) -> list[tuple[str, Any]]:
        msgs = []
        try:
            msgs.append(self.inbox.get(timeout=timeout_s) if timeout_s > 0 else self.inbox.get_nowait())
        except queue.Empty:
            return msgs
        while True:
            try:
                msgs.append(self.inbox.get_nowait())
            except queue.Empty:
                return msgs

    def send(self, outputs: list[EngineCoreOutput], stats: SchedulerStats) -> None:
        self.deliver((outputs, stats))


class InprocClient(EngineCoreClient):
    """Engine core on a thread of this process (``OCTAVO_ENGINE_INPROC=1``)."""

    def __init__(self, config: OctavoConfig) -> None:
        super().__init__()
        self.config = config
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        from octavo.engine.core import EngineCore

        self._queue = asyncio.Queue(MAX_PENDING_BATCHES)
        aloop = asyncio.get_running_loop()
        core = await asyncio.to_thread(EngineCore, self.config)
        self.engine_info = engine_facts(core)

        def deliver(item: Any) -> None:
            """Blocks the engine thread while ``MAX_PENDING_BATCHES`` wait (until shutdown)."""
            try:
                done = asyncio.run_coroutine_threadsafe(self._queue.put(item), aloop)
            except RuntimeError:  # the event loop is closed
                return
            while not (self._closing or aloop.is_closed()):
                try:
                    return done.result(timeout=0.2)
                except concurrent.futures.TimeoutError:
                    pass
            done.cancel()

        def run() -> None:
            try:
                QueueEngineCoreLoop(core, self._inbox, deliver).run()
            except BaseException as e:
                logger.exception("engine core thread failed")
                try:
                    aloop.call_soon_threadsafe(self._mark_dead, f"engine core failed: {e!r}")
                except RuntimeError:
                    pass

        self._thread = threading.Thread(target=run, name="octavo-engine-core", daemon=True)
        self._thread.start()

    def add_requests(self, requests: list[Request]) -> None:
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        for r in requests:
            self._inbox.put((serial.ADD, r))

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._inbox.put((serial.ABORT, list(request_ids)))

    def _control(self, kind: str, request_ids: list[str]) -> None:
        if request_ids:
            self._inbox.put((kind, list(request_ids)))

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._closing:
            return
        self._closing = True
        self._inbox.put((serial.SHUTDOWN, None))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout_s)


def make_client(
    config: OctavoConfig,
    engine_args: EngineArgs,
    inproc: bool | None = None,
    engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S,
) -> EngineCoreClient:
    """The in-process client has no heartbeat (it is a debugging aid); the process client does."""
    from octavo import envs

    if inproc is None:
        inproc = envs.OCTAVO_ENGINE_INPROC
    return InprocClient(config) if inproc else MPClient(config, engine_args, engine_timeout_s)
