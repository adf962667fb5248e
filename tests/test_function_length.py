"""No function in the engine's hot rooms grows past ``MAX_LINES``: split along the seams.

Counted from the ``def`` line to the function's last line, docstring included (decorators
not), for every function and method in ``octavo/core``, ``octavo/engine``, ``octavo/worker``.
"""

from __future__ import annotations

import ast
from pathlib import Path

OCTAVO = Path(__file__).resolve().parents[1] / "octavo"
ROOMS = ("core", "engine", "worker")
MAX_LINES = 70


def long_functions(path: Path, limit: int = MAX_LINES) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{node.name} (line {node.lineno}): {n} lines")
    return out


def test_no_function_longer_than_the_limit():
    offenders = []
    for room in ROOMS:
        for path in sorted((OCTAVO / room).rglob("*.py")):
            offenders += [f"{path.relative_to(OCTAVO.parent)}: {f}" for f in long_functions(path)]
    assert not offenders, f"functions over {MAX_LINES} lines:\n" + "\n".join(offenders)


def test_the_counter_sees_nested_and_async_functions(tmp_path):
    f = tmp_path / "m.py"
    body = "".join(f"        x{i} = {i}\n" for i in range(5))
    f.write_text(f"class A:\n    async def m(self):\n{body}\ndef g():\n    def inner():\n{body}")
    assert [s.split(" ")[0] for s in long_functions(f, limit=4)] == ["g", "m", "inner"]
