"""The engine asks the platform, never a vendor's torch module: ``torch.cuda`` (and
``torch.xpu`` / ``torch_xla``) appear in code only under ``octavo/platforms/`` and in the
modules written for that hardware (its attention backends, the XLA communicator). Comments and
strings do not count."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

OCTAVO = Path(__file__).resolve().parents[2] / "octavo"

# module -> files outside octavo/platforms allowed to use it
ALLOWED = {
    "torch.cuda": {"attention/backends/flash_attn.py", "attention/backends/triton_paged.py"},
    "torch.xpu": {"attention/backends/ipex.py"},
    "torch_xla": {"attention/backends/xla.py", "distributed/communicator.py"},  # TPU collectives
}


def _uses(path: Path) -> set[str]:
    """Vendor modules referenced in code: ``torch.cuda``, ``from torch import cuda``, ``torch_xla``."""
    toks = [
        t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if t.type in (tokenize.NAME, tokenize.OP)
    ]
    found = set()
    for i, t in enumerate(toks):
        if t.string == "torch_xla":
            found.add("torch_xla")
        if t.string == "torch" and i + 2 < len(toks):
            nxt, name = toks[i + 1].string, toks[i + 2].string
            if nxt in (".", "import") and name in ("cuda", "xpu"):
                found.add(f"torch.{name}")
    return found


def test_no_vendor_torch_modules_outside_platforms():
    leaks = []
    for path in sorted(OCTAVO.rglob("*.py")):
        rel = path.relative_to(OCTAVO).as_posix()
        if rel.startswith("platforms/"):
            continue
        for module in _uses(path):
            if rel not in ALLOWED[module]:
                leaks.append(f"octavo/{rel}: {module}")
    assert not leaks, "ask current_platform instead of:\n" + "\n".join(leaks)


def test_the_scanner_sees_code_but_not_prose(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""torch.cuda in a docstring"""\n# torch.cuda in a comment\nx = "torch.xpu"\n')
    assert _uses(f) == set()
    f.write_text("import torch\nfrom torch import cuda\ny = torch.xpu.device_count()\nimport torch_xla\n")
    assert _uses(f) == {"torch.cuda", "torch.xpu", "torch_xla"}


# Device questions a module outside the platform layer must not ask itself: the platform it was
# handed answers them (``device_is_host()``, ``fused_op_kernels``, ``get_graph_capture``...).
DEVICE_QUESTION_DIRS = ("platforms/", "attention/backends/", "testing/")


def _device_questions(path: Path) -> list[str]:
    """``x.device.type``, ``x.is_cuda``/``is_cpu``/``is_xpu``, ``device_type ==``/``!=``,
    ``getattr(torch, ...)`` in code (comments and strings do not count)."""
    toks = [
        t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if t.type in (tokenize.NAME, tokenize.OP)
    ]
    found = []
    for i, t in enumerate(toks):
        prev = toks[i - 1].string if i else ""
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        if t.string in ("is_cuda", "is_cpu", "is_xpu") and prev == ".":
            found.append(f"line {t.start[0]}: .{t.string}")
        elif t.string == "type" and prev == "." and i >= 2 and toks[i - 2].string == "device":
            found.append(f"line {t.start[0]}: device.type")
        elif t.string == "device_type" and nxt in ("==", "!="):
            found.append(f"line {t.start[0]}: device_type {nxt}")
        elif t.string == "getattr" and nxt == "(" and i + 2 < len(toks) and toks[i + 2].string == "torch":
            found.append(f"line {t.start[0]}: getattr(torch, ...)")
    return found


def test_no_device_questions_outside_the_platform_layer():
    leaks = []
    for path in sorted(OCTAVO.rglob("*.py")):
        rel = path.relative_to(OCTAVO).as_posix()
        if rel.startswith(DEVICE_QUESTION_DIRS):
            continue
        leaks += [f"octavo/{rel} {q}" for q in _device_questions(path)]
    assert not leaks, "ask the platform instead:\n" + "\n".join(leaks)


def test_the_device_question_scanner_can_fail(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""x.device.type in a docstring"""\n# x.is_cuda\ns = "device_type == 1"\n')
    assert _device_questions(f) == []
    f.write_text(
        "a = x.device.type == 'cpu'\nb = x.is_cuda\nc = p.device_type != 'cpu'\n"
        "m = getattr(torch, d)\nok = platform.device_type\n"
    )
    assert len(_device_questions(f)) == 4
