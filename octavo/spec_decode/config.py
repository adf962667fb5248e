"""``--speculative-config``: vLLM's JSON keys, validated into a ``SpeculativeConfig``.

Only what octavo runs is accepted: a method or key it does not honour is an error naming
it (never silently ignored). vLLM's defaults for the n-gram window: both bounds unset -> 5;
one set -> the other takes its value.

The method is inferred as vLLM infers it when ``method`` is left out: ``model`` ``"ngram"`` (or
``"[ngram]"``) means prompt lookup, any other ``model`` a draft model (``draft_model``), unless
the checkpoint name says EAGLE (``eagle-``: ``eagle``; ``eagle3-``: ``eagle3``). The draft model's or EAGLE head's folder is resolved and checked against the target
(same vocabulary; for a head, the same hidden size) by ``EngineArgs``.
"""

from __future__ import annotations

import json
from typing import Any

from octavo.config import SpeculativeConfig

FLAG = "--speculative-config"
SUPPORTED_METHODS = ("ngram", "draft_model", "eagle", "eagle3")
# vLLM methods octavo does not run (yet): named in the error so the user knows it is not a typo.
KNOWN_UNSUPPORTED_METHODS = ( "medusa", "mlp_speculator", "mtp", "suffix")
KNOWN_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model")
# The keys each method reads (another known key given with it is an error naming it).
METHOD_KEYS = {
    "ngram": ("prompt_lookup_min", "prompt_lookup_max"),
    "draft_model": ("model",),
    "eagle": ("model",),
    "eagle3": ("model",),
}
# vLLM keys that only apply to methods octavo does not run, or tuning octavo does not have.
KNOWN_UNSUPPORTED_KEYS = (
    "draft_tensor_parallel_size", "quantization", "max_model_len", "revision",
    "code_revision", "disable_by_batch_size", "disable_logprobs", "disable_padded_drafter_batch",
    "speculative_token_tree", "parallel_drafting", "enforce_eager",
)


def _as_dict(value: str | dict | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{FLAG} must be a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{FLAG} must be a JSON object; got {value!r}")
    return dict(value)


def _check_keys(d: dict[str, Any]) -> None:
    unsupported = sorted(k for k in d if k in KNOWN_UNSUPPORTED_KEYS and d[k] is not None)
    if unsupported:
        raise ValueError(f"{FLAG}: keys {unsupported} are not supported by octavo; supported keys: {list(KNOWN_KEYS)}")
    unknown = sorted(set(d) - set(KNOWN_KEYS) - set(KNOWN_UNSUPPORTED_KEYS))
    if unknown:
        raise ValueError(f"{FLAG}: unknown keys {unknown}; known: {list(KNOWN_KEYS)}")


def _infer_method(d: dict[str, Any]) -> Any:
    """vLLM's rule when ``method`` is left out: from ``model`` (see the module docstring)."""
    method, model = d.get("method"), d.get("model")
    if method is not None or model is None:
        return method
    if model in ("ngram", "[ngram]"):
        d.pop("model")
        return "ngram"
    name = str(model).lower()
    if "eagle3-" in name:
        return "eagle3"
    return "eagle" if "eagle-" in name else "draft_model"


def _check_method(method: Any) -> str:
    if method in SUPPORTED_METHODS:
        return method
    if method is None:
        raise ValueError(f"{FLAG}: 'method' is required (or a draft 'model') (supported: {list(SUPPORTED_METHODS)})")
    what = "is not supported by octavo" if method in KNOWN_UNSUPPORTED_METHODS else "is unknown"
    raise ValueError(f"{FLAG}: method {method!r} {what}; supported: {list(SUPPORTED_METHODS)}")


def _check_method_keys(d: dict[str, Any], method: str) -> None:
    """Keys of another method are refused (never silently ignored)."""
    foreign = sorted(k for k in KNOWN_KEYS if k not in ("method", "num_speculative_tokens", *METHOD_KEYS[method])
                     and d.get(k) is not None)
    if foreign:
        raise ValueError(f"{FLAG}: keys {foreign} do not apply to method {method!r}; it reads "
                         f"{['num_speculative_tokens', *METHOD_KEYS[method]]}")
    if method == "draft_model" and not isinstance(d.get("model"), str):
        raise ValueError(f"{FLAG}: method 'draft_model' needs 'model': the draft checkpoint (a folder or a Hub id)")
    if method in ("eagle", "eagle3") and not isinstance(d.get("model"), str):
        raise ValueError(f"{FLAG}: method {method!r} needs 'model': the EAGLE head checkpoint (a folder or a Hub id)")


def _positive_int(d: dict[str, Any], key: str, minimum: int) -> None:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{FLAG}: {key} must be an integer >= {minimum}; got {v!r}")


def _ngram_window(d: dict[str, Any]) -> None:
    lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
    if lo is None and hi is None:
        lo = hi = 5
    d["prompt_lookup_min"] = hi if lo is None else lo
    d["prompt_lookup_max"] = lo if hi is None else hi
    _positive_int(d, "prompt_lookup_min", 1)
    _positive_int(d, "prompt_lookup_max", 1)
    if d["prompt_lookup_max"] < d["prompt_lookup_min"]:
        raise ValueError(
            f"{FLAG}: prompt_lookup_max ({d['prompt_lookup_max']}) must be >= prompt_lookup_min "
            f"({d['prompt_lookup_min']})"
        )


def parse_speculative_config(value: str | dict | None) -> SpeculativeConfig | None:
    """The validated config, or None when speculative decoding is off (no value).

    For ``draft_model``, ``eagle`` and ``eagle3`` the result's ``model`` is the name as given;
    ``EngineArgs`` resolves it and attaches the draft's (head's) ``ModelConfig``."""
    d = _as_dict(value)
    if d is None:
        return None
    _check_keys(d)
    method = _check_method(_infer_method(d))
    _check_method_keys(d, method)
    if d.get("num_speculative_tokens") is None:
        raise ValueError(f"{FLAG}: num_speculative_tokens is required for method {method!r}")
    _positive_int(d, "num_speculative_tokens", 1)
    if method == "ngram":
        _ngram_window(d)
    else:
        d.pop("prompt_lookup_min", None), d.pop("prompt_lookup_max", None)
    d["method"] = method
    return SpeculativeConfig(**{k: v for k, v in d.items() if v is not None})


def speculative_config_dict(cfg: SpeculativeConfig | None) -> dict[str, Any] | None:
    """The JSON-able form (what a tensor-parallel worker receives)."""
    if cfg is None:
        return None
    return {k: getattr(cfg, k) for k in ("method", "num_speculative_tokens", *METHOD_KEYS[cfg.method])}
