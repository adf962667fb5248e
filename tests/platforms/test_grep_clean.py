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
