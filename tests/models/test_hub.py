"""Hub ids download through the real ``huggingface_hub`` client from a fake Hub on loopback.

Each case runs octavo in a fresh interpreter with ``HF_ENDPOINT`` pointing at the server (the
client reads its settings at import) and a private ``HF_HOME``: nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.fake_hub import FakeHub, commit_id, repo_files

REPO = "octavo-test/tiny-llama"
PROMPT = [3, 4, 5, 6, 7, 8]

_SCRIPT = r"""
import json, sys
args = json.loads(sys.argv[1])
try:
    if args.pop("generate"):
        from octavo import LLM, SamplingParams
        llm = LLM(dtype="float32", **args)
        out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
        print(json.dumps({"path": llm.llm_engine.config.model_config.model,
                          "tokenizer": llm.llm_engine.config.model_config.tokenizer,
                          "tokens": out[0].outputs[0].token_ids}))
    else:
        from octavo.engine.model_files import resolve_model_path
        print(json.dumps({"path": resolve_model_path(args["model"], args.get("revision"))}))
except ValueError as e:
    print(json.dumps({"error": str(e)}))
""".replace("PROMPT", repr(PROMPT))


def _run(hub: FakeHub, home, generate: bool = True, env: dict | None = None, **kwargs) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    e.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", **(env or {}))
    e["PYTHONPATH"] = os.pathsep.join([os.getcwd(), e.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps({"generate": generate, **kwargs})],
        capture_output=True, text=True, env=e, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _bin_bytes(folder) -> bytes:
    import io

    import torch
    from safetensors.torch import load_file

    buf = io.BytesIO()
    torch.save(load_file(os.path.join(folder, "model.safetensors")), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def hub_repos(llama_dir):
    files = repo_files(llama_dir)
    no_st = {k: v for k, v in files.items() if not k.endswith(".safetensors")}
    v1 = {**files, "pytorch_model.bin": b"must never be fetched", "README.md": b"# tiny", "onnx/model.onnx": b"x"}
    return {
        REPO: {"v1": v1, "main": {"README.md": b"# moved"}},
        "octavo-test/private": {"main": files},
        "octavo-test/bin-only": {"main": {**no_st, "pytorch_model.bin": _bin_bytes(llama_dir)}},
        "octavo-test/no-weights": {"main": no_st},
    }


@pytest.fixture(scope="module")
def expected_tokens(llama_dir):
    from octavo import LLM, SamplingParams

    out = LLM(llama_dir, dtype="float32").generate(
        {"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False
    )
    return out[0].outputs[0].token_ids


def test_hub_id_downloads_pinned_revision_then_cache_then_offline(hub_repos, expected_tokens, tmp_path):
    home = tmp_path / "hf"
    with FakeHub(hub_repos) as hub:
        first = _run(hub, home, model=REPO, revision="v1")
        assert "error" not in first, first
        assert first["tokens"] == expected_tokens
        assert first["path"].endswith(commit_id(REPO, "v1"))  # the pinned revision's snapshot
        fetched = sorted(hub.downloads())
        assert "model.safetensors" in fetched and "config.json" in fetched and "tokenizer.json" in fetched
        assert "pytorch_model.bin" not in fetched  # one weight format only
        assert "README.md" not in fetched and "onnx/model.onnx" not in fetched
        assert len(fetched) == len(set(fetched))

        hub.requests.clear()
        second = _run(hub, home, model=REPO, revision="v1")
        assert second["tokens"] == expected_tokens and second["path"] == first["path"]
        assert hub.downloads() == []  # everything came from the cache

        hub.requests.clear()
        third = _run(hub, home, model=REPO, revision="v1", env={"HF_HUB_OFFLINE": "1"})
        assert third.get("tokens") == expected_tokens, third
        assert hub.requests == []  # offline: not one request


def test_download_dir_and_hub_tokenizer(hub_repos, expected_tokens, tmp_path):
    dl = tmp_path / "models"
    with FakeHub(hub_repos) as hub:
        out = _run(hub, tmp_path / "hf", model=REPO, revision="v1", download_dir=str(dl),
                   tokenizer="octavo-test/private", tokenizer_revision="main", env={"HF_TOKEN": "sesame"})
        hub.private["octavo-test/private"] = "sesame"
    assert out["tokens"] == expected_tokens
    assert out["path"].startswith(str(dl)) and out["tokenizer"].startswith(str(dl))
    # The tokenizer-only snapshot holds no weights.
    assert not any(f.endswith(".safetensors") for f in os.listdir(out["tokenizer"]))


def test_private_repo_needs_token(hub_repos, expected_tokens, tmp_path):
    with FakeHub(hub_repos, private={"octavo-test/private": "sesame"}) as hub:
        denied = _run(hub, tmp_path / "hf", generate=False, model="octavo-test/private")
        assert "needs HF_TOKEN" in denied["error"] and "octavo-test/private" in denied["error"]
        ok = _run(hub, tmp_path / "hf", model="octavo-test/private", env={"HF_TOKEN": "sesame"})
        assert ok["tokens"] == expected_tokens


def test_missing_repo_and_revision_are_named(hub_repos, tmp_path):
    with FakeHub(hub_repos) as hub:
        missing = _run(hub, tmp_path / "hf", generate=False, model="octavo-test/nope")
        assert "not found" in missing["error"] and "octavo-test/nope" in missing["error"]
        rev = _run(hub, tmp_path / "hf", generate=False, model=REPO, revision="v9")
        assert "revision 'v9' not found" in rev["error"]
        offline = _run(hub, tmp_path / "hf", generate=False, model=REPO, env={"HF_HUB_OFFLINE": "1"})
        assert "not in the local cache" in offline["error"]


def test_bin_only_repo_fetches_bin(hub_repos, expected_tokens, tmp_path):
    with FakeHub(hub_repos) as hub:
        out = _run(hub, tmp_path / "hf", model="octavo-test/bin-only")
        assert out.get("tokens") == expected_tokens, out
        assert "pytorch_model.bin" in hub.downloads()
        none = _run(hub, tmp_path / "hf", generate=False, model="octavo-test/no-weights")
        assert "no *.safetensors or pytorch_model*.bin weights" in none["error"]
