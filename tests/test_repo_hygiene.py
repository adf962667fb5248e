"""A clone is all a user has: no tracked file points outside the repository or at the machines
and sessions the project was developed on, and no script edits git's own files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "a path to a sibling checkout": re.compile(r"\.\./shared\b"),
    "a development-machine path": re.compile(r"(?<![\w.])/work/|/root/\.cache|octavo-anchors"),
    "a host path outside the repo": re.compile(r"(?<![\w.])/opt/(?!venv\b)"),
    "a development machine or its booking": re.compile(r"lent H200|\blease[sd]?\b"),
    "git's own files": re.compile(r"\.git/info/exclude"),
    "an issue number in prose": re.compile(r"\b[Ii]ssues? #?\d+\b"),
}
# Data files whose content is not prose (a tokenizer vocabulary holds the word "lease").
SKIP = {"octavo/assets/default_model/tokenizer.json"}


def tracked_text_files() -> list[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode().split("\0")
    out = []
    for name in filter(None, names):
        path = REPO / name
        if name in SKIP or not path.is_file() or path.suffix in (".safetensors", ".png"):
            continue
        out.append(path)
    return out


def findings(text: str) -> list[str]:
    return [f"{what}: {m.group(0)!r}" for what, rx in FORBIDDEN.items() for m in rx.finditer(text)]


def test_no_tracked_file_refers_outside_the_repo():
    bad = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            bad += [f"{path.relative_to(REPO)}:{lineno}: {f}" for f in findings(line)]
    assert not bad, "\n".join(bad)


def test_the_patterns_match_what_they_name():
    assert findings("see ../shared/anchors/x.py") and findings("cd /work/main") and findings("lent H200")
    assert findings("one lease") and findings("echo x >> .git/info/exclude") and findings("fixes issue 6")
    assert findings("/root/.cache/octavo-anchors/m") and findings("/opt/torch/.venv/bin/python3")
    assert not findings("RUN python -m venv /opt/venv") and not findings("released under a licence")
    assert not findings("docs/work/x and a framework/working dir")
