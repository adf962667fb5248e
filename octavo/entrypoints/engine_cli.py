"""The engine flags of ``octavo generate`` / ``octavo serve``, generated from ``EngineArgs``.

Every field of ``EngineArgs`` becomes ``--field-name`` with the field's docstring as its help
(as vLLM does). The fields are read from the class's *source* with ``ast``, not by importing
it: ``EngineArgs`` lives next to torch-heavy code, and ``octavo --help`` / ``octavo serve
--help`` must never import torch. A test checks the parsed fields against the real dataclass.

Types come from the annotation (``int``, ``float``, ``str``, ``list[str]``: one or more
values, ``bool``: ``--x/--no-x``, or ``--x`` when the default is False); choices and short
aliases, which are CLI matters, are in ``CHOICES`` and ``ALIASES`` below.
"""

from __future__ import annotations

import argparse
import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parents[1]
# Where EngineArgs is defined.
_SOURCES = (_PACKAGE / "engine" / "arg_utils.py",)

CHOICES: dict[str, list[str]] = {
    "load_format": ["auto", "safetensors", "pt", "gguf", "dummy"],
    "prefix_caching_hash_algo": ["sha256", "xxhash"],
    "scheduling_policy": ["fcfs", "priority"],
    "distributed_executor_backend": ["mp", "ray"],
    "guided_decoding_backend": ["auto", "xgrammar"],
    "reasoning_parser": ["deepseek_r1", "qwen3"],
}
ALIASES: dict[str, list[str]] = {
    "tensor_parallel_size": ["-tp"], "pipeline_parallel_size": ["-pp"], "quantization": ["-q"],
}


@dataclass(frozen=True)
class EngineField:
    name: str
    annotation: str
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _default(node: ast.expr | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None  # a computed default: the dataclass decides


@functools.lru_cache(maxsize=1)
def engine_fields() -> tuple[EngineField, ...]:
    """``EngineArgs``'s fields in order, from its source (no import of the module)."""
    for path in _SOURCES:
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs"), None)
        if cls is None:
            continue
        out = []
        for i, node in enumerate(cls.body):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            nxt = cls.body[i + 1] if i + 1 < len(cls.body) else None
            doc = nxt.value.value if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                                      and isinstance(nxt.value.value, str)) else ""
            out.append(EngineField(node.target.id, ast.unparse(node.annotation), _default(node.value),
                                   " ".join(doc.split())))
        return tuple(out)
    raise RuntimeError(f"class EngineArgs not found in {[str(p) for p in _SOURCES]}")


def _kwargs(f: EngineField) -> dict[str, Any]:
    ann = f.annotation.replace(" ", "")
    kw: dict[str, Any] = {"default": f.default, "help": _help(f)}
    if "bool" in ann.split("|"):
        kw["action"] = "store_true" if f.default is False else argparse.BooleanOptionalAction
    elif "list[str]" in ann:
        kw.update(nargs="+", metavar=f.name.upper())
    elif "int" in ann.split("|"):
        kw["type"] = int
    elif "float" in ann.split("|"):
        kw["type"] = float
    if f.name in CHOICES:
        kw["choices"] = CHOICES[f.name]
    return kw


def _help(f: EngineField) -> str:
    text = f.help.replace("%", "%%") or "(undocumented)"
    if f.default is not None and not isinstance(f.default, bool):  # (0 == False: test the type)
        text += " (default: %(default)s)"
    return text


def add_engine_args(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
    """Add every engine flag to ``parser``. With ``model_positional`` (``octavo serve MODEL``)
    ``--model`` is still accepted, as in vLLM; giving both is an error at parse time."""
    group = parser.add_argument_group("engine", "EngineArgs fields (the same names as keyword arguments of LLM)")
    for f in engine_fields():
        if f.name == "model" and model_positional:
            group.add_argument("--model", dest="model_flag", default=None, help=_help(f))
            continue
        group.add_argument(f.flag, *ALIASES.get(f.name, []), dest=f.name, **_kwargs(f))


def resolve_model_arg(args: argparse.Namespace) -> None:
    """``octavo serve [MODEL] [--model MODEL]``: one of the two, never two different ones."""
    flag = getattr(args, "model_flag", None)
    if flag is not None:
        if args.model is not None and args.model != flag:
            raise ValueError(f"the model is given twice: {args.model!r} and --model {flag!r}")
        args.model = flag
    if hasattr(args, "model_flag"):
        del args.model_flag
