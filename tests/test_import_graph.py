"""The package's import graph has no cycle and respects the layers of docs/architecture.md.

Every import counts: module level, inside functions, under ``TYPE_CHECKING``, relative ones, and
qualified class paths written as strings (``"octavo.platforms.cuda.CudaPlatform"``), which
registries import with ``importlib``. The layer table is read from docs/architecture.md, so
the written rule and the enforced rule are the same text.

The root ``octavo/__init__.py`` is the public facade (lazy re-exports via ``__getattr__``): any
module may import from it (``__version__``), and its own lazy imports are not edges.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "octavo"
LAYERS_DOC = REPO / "docs" / "architecture.md"
_CLASS_PATH = re.compile(r"octavo(\.\w+)+")


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst} (line {self.line})"


def package_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root/octavo``."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The longest module prefix of ``name`` (``a.b.Class`` -> ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _from_target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def module_edges(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    """Every octavo module ``module`` imports, wherever the import statement sits."""
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_target(module, path.name == "__init__.py", node)
            # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _CLASS_PATH.fullmatch(node.value):
            targets = [node.value]
        for target in targets:
            if target.split(".")[0] != PACKAGE:
                continue
            dst = _owner(target, modules)
            if dst is not None and dst != module and not (isinstance(node, ast.Constant) and dst == PACKAGE):
                edges.append(Edge(module, dst, node.lineno))
    return edges


def import_graph(root: Path) -> dict[str, list[Edge]]:
    modules = package_modules(root)
    return {
        m: ([] if m == PACKAGE else module_edges(m, p, modules))  # the facade's lazy imports
        for m, p in modules.items()
    }


def cycles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            edge = next(it, None)
            if edge is not None:
                w = edge.dst
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph.get(w, []))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def documented_layers(doc: Path = LAYERS_DOC) -> list[list[str]]:
    """The layer table of docs/architecture.md, lowest layer first.

    The table follows the line ``<!-- layers -->``: one row per layer, its rooms in backticks.
    """
    text = doc.read_text()
    assert "<!-- layers -->" in text, f"{doc} lost its '<!-- layers -->' table"
    rows = []
    for line in text.split("<!-- layers -->", 1)[1].lstrip().splitlines():
        if not line.startswith("|"):
            break
        rooms = re.findall(r"`(octavo[\w.]*)`", line)
        if rooms:
            rows.append(rooms)
    return rows


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """Index of the layer whose room is the longest prefix of ``module``."""
    best: tuple[int, int] | None = None
    for i, rooms in enumerate(layers):
        for room in rooms:
            if module == room or module.startswith(room + "."):
                if best is None or len(room) > best[1]:
                    best = (i, len(room))
    return None if best is None else best[0]


def layer_violations(graph: dict[str, list[Edge]], layers: list[list[str]]) -> list[str]:
    """Imports from a lower layer up into a higher one (the facade ``octavo`` is exempt)."""
    bad = []
    for module, edges in graph.items():
        src = layer_of(module, layers)
        for e in edges:
            dst = layer_of(e.dst, layers)
            if e.dst != PACKAGE and src is not None and dst is not None and dst > src:
                bad.append(f"{e}: layer {src} {layers[src]} imports layer {dst} {layers[dst]}")
    return bad


# -- the package itself ------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph() -> dict[str, list[Edge]]:
    return import_graph(REPO)


def test_no_import_cycle(graph):
    loops = cycles(graph)
    detail = "\n".join(
        "cycle: " + ", ".join(c) + "\n  " + "\n  ".join(str(e) for m in c for e in graph[m] if e.dst in c)
        for c in loops
    )
    assert not loops, detail


def test_imports_follow_the_documented_layers(graph):
    bad = layer_violations(graph, documented_layers())
    assert not bad, "imports against docs/architecture.md's layers:\n" + "\n".join(bad)


def test_every_module_has_a_layer(graph):
    layers = documented_layers()
    missing = sorted(m for m in graph if m != PACKAGE and layer_of(m, layers) is None)
    assert not missing, f"add these to the layer table in docs/architecture.md: {missing}"


def test_core_imports_only_leaves(graph):
    """The DESIGN rule spelled out: core/ sits on the leaf helpers and the config, nothing else."""
    layers = documented_layers()
    core = layer_of("octavo.core", layers)
    for module, edges in graph.items():
        if module.startswith("octavo.core"):
            assert all(layer_of(e.dst, layers) <= core for e in edges if e.dst != PACKAGE), module


# -- the scanner can fail ----------------------------------------------------------------
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_scanner_sees_every_kind_of_import(tmp_path):
    _write(tmp_path, {
        "octavo/__init__.py": "from octavo.top import thing\n",
        "octavo/low/__init__.py": "",
        "octavo/low/a.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from octavo.top import T\n"
            "def f():\n    from . import b\n    import octavo.top.impl\n"
            "PATH = 'octavo.top.impl.Impl'\n"
            "MSG = 'see octavo.top for details'\n"
        ),
        "octavo/low/b.py": "from .a import f\n",
        "octavo/top/__init__.py": "",
        "octavo/top/impl.py": "",
    })
    g = import_graph(tmp_path)
    assert {(e.dst, e.line) for e in g["octavo.low.a"]} == {
        ("octavo.top", 3), ("octavo.low.b", 5), ("octavo.top.impl", 6), ("octavo.top.impl", 7),
    }
    assert g["octavo"] == []  # the facade's re-exports are not edges
    assert cycles(g) == [["octavo.low.a", "octavo.low.b"]]
    layers = [["octavo.low"], ["octavo.top"]]
    assert len(layer_violations(g, layers)) == 3
    assert layer_violations(g, [["octavo.top"], ["octavo.low"]]) == []


def test_layer_table_parsing(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text(
        "# x\n<!-- layers -->\n| layer | rooms |\n|---|---|\n| 0 | `octavo.envs`, `octavo.utils` |\n"
        "| 1 | `octavo.core` |\n\nmore `octavo.nope` prose\n"
    )
    layers = documented_layers(doc)
    assert layers == [["octavo.envs", "octavo.utils"], ["octavo.core"]]
    assert layer_of("octavo.utils.plugins", layers) == 0
    assert layer_of("octavo.core", layers) == 1
    assert layer_of("octavo.nope", layers) is None
