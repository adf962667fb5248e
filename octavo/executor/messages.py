"""The calls a driver makes on its workers (``handle_call`` runs one on a worker).

Arguments and results travel through ``octavo.engine.serial``, the one msgpack codec of the
package: ``execute_model`` takes an encoded ``SchedulerOutput`` and answers an encoded
``ModelRunnerOutput`` (None on ranks other than 0).
"""

from __future__ import annotations

from typing import Any

from octavo.engine import serial


def handle_call(worker: Any, method: str, arg: Any) -> Any:
    """Run one driver call on a worker; returns plain data (msgpack-encodable)."""
    if method == "execute_model":
        out = worker.execute_model(serial.decode_scheduler_output(arg))
        return None if out is None else serial.encode_runner_output(out)
    if method == "determine_num_blocks":
        return worker.determine_num_blocks()
    if method == "initialize_kv_cache":
        worker.initialize_kv_cache(arg)
        return None
    if method == "propose_drafts":
        return worker.propose_drafts(arg)
    if method == "info":
        return worker.info()
    raise ValueError(f"unknown worker method {method!r}")
