"""Hugging Face Hub ids -> local folders, through ``huggingface_hub.snapshot_download``.

Only what octavo reads comes down: configs, tokenizer files and one weight format
(``*.safetensors`` when the repo has them, else ``pytorch_model*.bin``; never both). The Hub's
own settings apply unchanged: ``HF_TOKEN`` (or a stored login) authenticates, ``HF_ENDPOINT``
names the server, ``HF_HUB_OFFLINE=1`` answers from the local cache only, ``HF_HUB_CACHE`` /
``--download-dir`` say where files are kept. A second call for the same revision finds the
files in the cache and downloads nothing. Every failure is a ``ValueError`` that names the flag
and says what to do (set ``HF_TOKEN``, check the id or revision, go online).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# Files every model folder may need besides its weights.
CONFIG_PATTERNS = ["*.json", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]
SAFETENSORS_PATTERNS = ["*.safetensors", "*.safetensors.index.json"]
PYTORCH_BIN_PATTERNS = ["pytorch_model*.bin", "pytorch_model*.bin.index.json"]


def _weight_patterns(files: list[str]) -> list[str]:
    """The one weight format to fetch from a repo's file list (safetensors preferred)."""
    if any(f.endswith(".safetensors") for f in files):
        return SAFETENSORS_PATTERNS
    if any(f.startswith("pytorch_model") and f.endswith(".bin") for f in files):
        return PYTORCH_BIN_PATTERNS
    return []


def _explain(flag: str, repo_id: str, revision: str | None, err: Exception) -> ValueError:
    """A user-facing error for a failed Hub call, naming the flag and the fix."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{flag}: Hub repo {repo_id!r}"
    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, GatedRepoError) or (isinstance(err, HfHubHTTPError) and status in (401, 403)):
        return ValueError(
            f"{what} needs HF_TOKEN: the Hub refused access ({status}); it is private or gated, or "
            "it does not exist. Set HF_TOKEN to a token with access (and accept the model's terms "
            "on its page if it is gated)."
        )
    if isinstance(err, RevisionNotFoundError):
        return ValueError(f"{what}: revision {revision!r} not found (--revision)")
    if isinstance(err, RepositoryNotFoundError):
        return ValueError(f"{what} not found on the Hub; check the id (or pass a local folder)")
    if isinstance(err, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return ValueError(
            f"{what} (revision {revision or 'main'}) is not in the local cache and the Hub cannot be "
            f"reached (offline: HF_HUB_OFFLINE=1, or no connection): {err}"
        )
    return ValueError(f"{what}: download failed: {type(err).__name__}: {err}")


def _snapshot(repo_id: str, revision: str | None, download_dir: str | None, patterns: list[str]) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, revision=revision, cache_dir=download_dir, allow_patterns=patterns)


def _offline_snapshot(repo_id: str, revision: str | None, download_dir: str | None, weights: bool) -> str:
    """The cached snapshot of an earlier online run (offline mode): try each weight format."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    formats = [SAFETENSORS_PATTERNS, PYTORCH_BIN_PATTERNS] if weights else [[]]
    last: Exception | None = None
    for w in formats:
        try:
            return _snapshot(repo_id, revision, download_dir, CONFIG_PATTERNS + w)
        except LocalEntryNotFoundError as e:
            last = e
    assert last is not None
    raise last


def download_snapshot(
    repo_id: str,
    *,
    revision: str | None = None,
    download_dir: str | None = None,
    weights: bool = True,
    flag: str = "--model (model)",
) -> str:
    """Local folder holding ``repo_id`` at ``revision``: configs, tokenizer and (``weights``) one
    weight format. Downloads what the cache lacks, with the Hub client's progress bars."""
    from huggingface_hub import HfApi, constants

    try:
        if constants.HF_HUB_OFFLINE:
            return _offline_snapshot(repo_id, revision, download_dir, weights)
        patterns = list(CONFIG_PATTERNS)
        if weights:
            info = HfApi().model_info(repo_id, revision=revision)
            files = [s.rfilename for s in info.siblings or []]
            fmt = _weight_patterns(files)
            if not fmt:
                raise ValueError(
                    f"{flag}: Hub repo {repo_id!r} has no *.safetensors or pytorch_model*.bin weights "
                    f"(files: {', '.join(sorted(files)[:12])}); for GGUF pass the downloaded .gguf file"
                )
            patterns += fmt
        # By name (not by commit) so the cache records the branch/tag for offline runs.
        path = _snapshot(repo_id, revision, download_dir, patterns)
    except ValueError:
        raise
    except Exception as e:  # huggingface_hub raises its own error types (and httpx's)
        raise _explain(flag, repo_id, revision, e) from None
    logger.info("model %s (revision %s) in %s", repo_id, revision or "main", path)
    return path
