"""Benchmark workloads: ``random`` (token ids of exact lengths) and ShareGPT-format JSON.

A workload is a list of ``SampleRequest``s. The same list goes to every backend in a run
(octavo, HF transformers, a remote server), so their numbers are comparable.

ShareGPT format: a JSON list of ``{"id": ..., "conversations": [{"from": "human", "value":
...}, {"from": "gpt", "value": ...}, ...]}``. The first turn is the prompt and the second the
reference completion, whose token count is the request's output length (unless a fixed
``--output-len`` is given). Nothing is ever downloaded: pass a local file, or use the small
synthetic one that ships in ``octavo/benchmarks/data``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DATA_DIR = Path(__file__).parent / "data"
SYNTHETIC_SHAREGPT = DATA_DIR / "sharegpt_synthetic.json"


@dataclass
class SampleRequest:
    """One benchmark request. ``prompt`` is text, or a list of token ids of exact length."""

    prompt: str | list[int]
    prompt_len: int
    expected_output_len: int

    @property
    def is_token_ids(self) -> bool:
        return isinstance(self.prompt, list)


def special_ids(tokenizer: Any) -> set[int]:
    return set(getattr(tokenizer, "all_special_ids", None) or [])


def random_requests(
    num_prompts: int,
    input_len: int,
    output_len: int,
    vocab_size: int,
    seed: int = 0,
    exclude_ids: set[int] | None = None,
) -> list[SampleRequest]:
    """``num_prompts`` prompts of exactly ``input_len`` token ids, drawn uniformly (fixed seed)
    from ``[0, vocab_size)`` minus ``exclude_ids`` (special tokens), each asking for exactly
    ``output_len`` tokens."""
    if num_prompts < 1 or input_len < 1 or output_len < 1:
        raise ValueError(
            f"--num-prompts, --input-len and --output-len must be >= 1; got "
            f"{num_prompts}, {input_len}, {output_len}"
        )
    allowed = np.setdiff1d(np.arange(vocab_size), np.array(sorted(exclude_ids or ()), dtype=np.int64))
    if allowed.size == 0:
        raise ValueError("the vocabulary has no non-special token to build random prompts from")
    rng = np.random.default_rng(seed)
    ids = allowed[rng.integers(0, allowed.size, size=(num_prompts, input_len))]
    return [SampleRequest(row.tolist(), input_len, output_len) for row in ids]


def load_sharegpt(
    path: str | Path,
    tokenizer: Any,
    num_prompts: int,
    output_len: int | None = None,
    seed: int = 0,
    max_prompt_len: int = 1024,
    max_total_len: int = 2048,
) -> list[SampleRequest]:
    """Sample ``num_prompts`` conversations from a ShareGPT-format file (vLLM's filtering rules:
    prompt and completion >= 4 tokens, prompt <= ``max_prompt_len``, total <= ``max_total_len``).
    Conversations are reused round-robin when the file has fewer usable ones than asked for."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations")
    convs = [
        d["conversations"]
        for d in data
        if isinstance(d, dict) and len(d.get("conversations") or []) >= 2
    ]
    random.Random(seed).shuffle(convs)
    usable: list[SampleRequest] = []
    for conv in convs:
        prompt, completion = conv[0]["value"], conv[1]["value"]
        prompt_len = len(tokenizer.encode(prompt))
        out_len = output_len if output_len is not None else len(tokenizer.encode(completion))
        if prompt_len < 4 or (output_len is None and out_len < 4):
            continue
        if prompt_len > max_prompt_len or prompt_len + out_len > max_total_len:
            continue
        usable.append(SampleRequest(prompt, prompt_len, out_len))
        if len(usable) == num_prompts:
            break
    if not usable:
        raise ValueError(f"{path}: no conversation passes the length filters")
    return [usable[i % len(usable)] for i in range(num_prompts)]


def get_requests(
    dataset: str,
    tokenizer: Any,
    num_prompts: int,
    input_len: int,
    output_len: int | None,
    seed: int = 0,
    max_model_len: int | None = None,
) -> list[SampleRequest]:
    """``dataset`` is ``random``, ``sharegpt`` (the shipped synthetic file) or a JSON path."""
    if dataset == "random":
        vocab = len(tokenizer)
        reqs = random_requests(
            num_prompts, input_len, output_len or 128, vocab, seed, special_ids(tokenizer)
        )
    else:
        path = SYNTHETIC_SHAREGPT if dataset == "sharegpt" else Path(dataset)
        if not path.exists():
            raise ValueError(f"--dataset: {str(path)!r} is neither 'random' nor an existing file")
        total = max_model_len - 1 if max_model_len else 2048
        reqs = load_sharegpt(
            path, tokenizer, num_prompts, output_len, seed,
            max_prompt_len=min(1024, total - 1), max_total_len=total,
        )
    if max_model_len is not None:
        for r in reqs:
            if r.prompt_len + r.expected_output_len > max_model_len:
                raise ValueError(
                    f"a request needs {r.prompt_len} + {r.expected_output_len} tokens, more than "
                    f"--max-model-len {max_model_len}"
                )
    return reqs


def write_synthetic_sharegpt(path: str | Path, num_conversations: int = 64, seed: int = 0) -> None:
    """Write the small synthetic ShareGPT-format file that ships for tests (deterministic)."""
    words = (
        "the engine schedules every request under one token budget while the paged cache "
        "keeps blocks of keys and values so a prompt can share its prefix with another one "
        "and decoding steps run as one batch of many sequences at once on any device"
    ).split()
    rng = random.Random(seed)

    def sentence(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."

    data = []
    for i in range(num_conversations):
        q = " ".join(sentence(rng.randint(6, 14)) for _ in range(rng.randint(1, 4)))
        a = " ".join(sentence(rng.randint(6, 14)) for _ in range(rng.randint(1, 6)))
        data.append(
            {
                "id": f"synthetic-{i}",
                "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}],
            }
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
