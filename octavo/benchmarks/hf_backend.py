"""The naive baseline: the same workload through HF transformers ``generate`` (static batching).

Prompts go in as the same token ids octavo gets (text prompts are tokenized once, with the
same tokenizer); batches are left-padded; every row generates exactly the requested number of
tokens (``min_new_tokens = max_new_tokens``, greedy), so output counts match octavo's with
``ignore_eos``. In a batch whose requests want different lengths every row runs to the
longest: that waste is the cost of static batching and is counted against HF (output tokens
reported are the requested ones).
"""

from __future__ import annotations

import time
from typing import Any

from octavo.benchmarks.datasets import SampleRequest


def load_hf_model(model_dir: str, dtype: Any, load_format: str = "auto", seed: int = 0) -> tuple[Any, float]:
    """``(model, load_seconds)``. ``load_format="dummy"`` builds the architecture with random
    weights (``from_config``), as octavo's dummy loader does."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.perf_counter()
    if load_format == "dummy":
        torch.manual_seed(seed)
        cfg = AutoConfig.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.eval()
    return model, time.perf_counter() - t0


def _token_ids(req: SampleRequest, tokenizer: Any) -> list[int]:
    return list(req.prompt) if isinstance(req.prompt, list) else tokenizer.encode(req.prompt)


def _pad_id(model: Any, tokenizer: Any) -> int:
    for v in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None),
              getattr(model.generation_config, "pad_token_id", None)):
        if isinstance(v, int):
            return v
    return 0


class _Stamp:
    """A logits processor that records when each step's logits are ready (one per token)."""

    def __init__(self) -> None:
        self.ts: list[float] = []

    def __call__(self, input_ids, scores):
        self.ts.append(time.perf_counter())
        return scores


def generate_batch(model: Any, tokenizer: Any, batch: list[list[int]], max_new_tokens: int,
                   stamp: _Stamp | None = None) -> Any:
    """Greedy ``generate`` of exactly ``max_new_tokens`` for a left-padded batch of id lists."""
    import torch
    from transformers import LogitsProcessorList

    pad = _pad_id(model, tokenizer)
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, ids in enumerate(batch):
        input_ids[i, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        mask[i, width - len(ids):] = 1
    kwargs: dict[str, Any] = dict(
        input_ids=input_ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        pad_token_id=pad,
    )
    if stamp is not None:
        kwargs["logits_processor"] = LogitsProcessorList([stamp])
    with torch.inference_mode():
        out = model.generate(**kwargs)
    return out[:, width:]


def hf_throughput(model: Any, tokenizer: Any, requests: list[SampleRequest],
                  batch_size: int | None = None, disable_tqdm: bool = False) -> dict[str, Any]:
    """Run ``requests`` in static batches of ``batch_size`` (default: all at once)."""
    from tqdm.auto import tqdm

    bs = batch_size or len(requests)
    ids = [_token_ids(r, tokenizer) for r in requests]
    generated = 0
    bar = tqdm(total=len(requests), desc="HF generate", disable=disable_tqdm, dynamic_ncols=True)
    t0 = time.perf_counter()
    for start in range(0, len(requests), bs):
        chunk = requests[start:start + bs]
        n_new = max(r.expected_output_len for r in chunk)
        out = generate_batch(model, tokenizer, ids[start:start + bs], n_new)
        generated += out.numel()
        bar.update(len(chunk))
    wall = time.perf_counter() - t0
    bar.close()
    return {
        "wall_s": wall,
        "prompt_tokens": sum(len(x) for x in ids),
        "output_tokens": sum(r.expected_output_len for r in requests),
        "generated_tokens_incl_padding_waste": generated,
    }


def hf_latency_iteration(model: Any, tokenizer: Any, requests: list[SampleRequest],
                         output_len: int) -> dict[str, Any]:
    """One batch: time to first token, per-step times and end-to-end latency."""
    stamp = _Stamp()
    ids = [_token_ids(r, tokenizer) for r in requests]
    t0 = time.perf_counter()
    out = generate_batch(model, tokenizer, ids, output_len, stamp)
    e2e = time.perf_counter() - t0
    ts = stamp.ts
    return {
        "ttft_s": ts[0] - t0,
        "tpot_s": (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else None,
        "itl_s": [b - a for a, b in zip(ts, ts[1:], strict=False)],
        "e2e_s": e2e,
        "output_tokens": int(out.numel()),
    }
