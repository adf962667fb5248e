"""The published OpenAPI schema matches what ``octavo serve`` does: schemathesis runs every
check it has (``--checks all``: no 5xx, status codes / content types / response bodies as
declared, schema-invalid requests refused, schema-valid ones accepted) with at least 40
generated examples per operation against a real server. Settings: ``schemathesis.toml``
next to this file. Also ``nox -s api-contract``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.entrypoints.openai.utils import RemoteServer

CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.mark.contract
def test_schemathesis_all_checks_pass(llama_dir, tmp_path):
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if st is None:
        pytest.skip("schemathesis is not installed (pip install 'octavo[test]')")
    # a short context keeps the longest generations (max_tokens up to the context) quick
    srv = RemoteServer([llama_dir, "--dtype", "float32", "--max-model-len", "64"])
    try:
        cmd = [st, "--config-file", str(CONFIG), "run", f"{srv.url}/openapi.json", "--checks", "all",
               "--max-examples", "40", "--seed", "20261201", "--no-color"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
        summary = run.stdout[-6000:]
        assert run.returncode == 0, summary
        assert "No issues found" in run.stdout or " passed" in run.stdout, summary
    finally:
        srv.stop()
