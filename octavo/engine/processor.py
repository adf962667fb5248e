"""Input processing: tokenize, validate against the model, make core ``Request``s.

Every check a user can fail happens here, before anything is scheduled, and raises a
``ValueError`` naming the field and the allowed range.
"""

from __future__ import annotations

import time
from typing import Any

from octavo.config import OctavoConfig
from octavo.core.request import Request
from octavo.sampling_params import SamplingParams

PromptType = str | dict[str, Any] | list[int]


class Processor:
    def __init__(self, config: OctavoConfig, tokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.max_model_len = config.model_config.max_model_len
        self.vocab_size = config.model_config.vocab_size
        gen_eos = getattr(tokenizer, "eos_token_id", None)
        cfg_eos = getattr(config.model_config.hf_config, "eos_token_id", None)
        if isinstance(cfg_eos, list):
            cfg_eos = cfg_eos[0] if cfg_eos else None
        self.eos_token_id = gen_eos if gen_eos is not None else cfg_eos
        # Tokens the KV cache can hold; set by the engine once the pool is sized.
        self.kv_cache_tokens: int | None = None

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, (list, tuple)):
            return None, list(prompt)
        raise ValueError(f"prompt must be a string, a token id list or a dict, got {type(prompt).__name__}")

    def _check_token_ids(self, name: str, ids) -> None:
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size:
                raise ValueError(f"{name} contains token id {t!r} outside [0, {self.vocab_size})")

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        params.verify()  # again: a SamplingParams is mutable after construction
        if not prompt_ids:
            raise ValueError("the prompt is empty (prompt_token_ids must hold at least one token)")
        self._check_token_ids("prompt_token_ids", prompt_ids)
        n = len(prompt_ids)
        if n >= self.max_model_len:
            raise ValueError(
                f"the prompt has {n} tokens, but max_model_len is {self.max_model_len}: "
                f"the prompt must be shorter than max_model_len to leave room for output"
            )
        if params.max_tokens is not None and n + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"max_tokens ({params.max_tokens}) + prompt length ({n}) exceeds max_model_len "
                f"({self.max_model_len}); at most {self.max_model_len - n} tokens can be generated"
            )
        if params.logit_bias:
            self._check_token_ids("logit_bias", params.logit_bias.keys())
        if params.allowed_token_ids:
            self._check_token_ids("allowed_token_ids", params.allowed_token_ids)
        if params.stop_token_ids:
            self._check_token_ids("stop_token_ids", params.stop_token_ids)
        if params.logprobs is not None and params.logprobs > self.vocab_size:
            raise ValueError(f"logprobs must be <= vocab size ({self.vocab_size}); got {params.logprobs}")
        if params.prompt_logprobs is not None and params.prompt_logprobs > self.vocab_size:
            raise ValueError(
                f"prompt_logprobs must be <= vocab size ({self.vocab_size}); got {params.prompt_logprobs}"
            )
        if params.structured_outputs is not None:
            self._check_structured_outputs(params)
        if self.kv_cache_tokens is not None and n >= self.kv_cache_tokens:
            raise ValueError(
                f"the prompt has {n} tokens but the KV cache holds only {self.kv_cache_tokens}; "
                "it can never fit (raise num_gpu_blocks_override / the KV cache space, or "
                "shorten the prompt)"
            )

    def _check_structured_outputs(self, params: SamplingParams) -> None:
        """Apply the server's whitespace default, then parse the constraint (``ValueError``
        naming the problem); compiling it against the vocabulary is the engine's job."""
        from octavo.structured_output.grammar import build_grammar

        so = params.structured_outputs
        if self.config.structured_outputs_config.disable_any_whitespace:
            so.disable_any_whitespace = True
        build_grammar(so)

    def bad_words_token_ids(self, bad_words: list[str]) -> list[list[int]]:
        """Token sequences to forbid for each bad word, as vLLM derives them.

        Each word is encoded as written (without leading spaces) and, when the tokenizer
        gives a different first token for it, also with one leading space: a word in the
        middle of a sentence usually starts with a space token.
        """
        out: list[list[int]] = []
        for word in bad_words:
            plain = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            if plain:
                out.append(plain)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
                out.append(spaced)
        return out

    def make_requests(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> tuple[str | None, list[int], list[Request]]:
        """One Request per sample: ``n > 1`` makes children ``{i}_{request_id}``.

        Child ``i`` gets ``seed + i`` when a seed is set, and only child 0 computes
        ``prompt_logprobs`` (the prompt is the same), which lets the others share the
        prompt's KV through the prefix cache.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        text, ids = self.tokenize(prompt)
        self.validate(ids, params)
        if params.bad_words and not params._bad_words_token_ids:
            params._bad_words_token_ids = self.bad_words_token_ids(params.bad_words)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        if params.n == 1:
            child_ids = [request_id]
            child_params = [params]
        else:
            child_ids = [f"{i}_{request_id}" for i in range(params.n)]
            child_params = []
            for i in range(params.n):
                p = params.clone()
                p.n = 1
                if p.seed is not None:
                    p.seed = p.seed + i
                if i > 0:
                    p.prompt_logprobs = None
                child_params.append(p)
        parent = request_id if params.n > 1 else None
        reqs = [
            Request(cid, ids, p, self.eos_token_id, arrival, priority, cache_salt, parent)
            for cid, p in zip(child_ids, child_params, strict=True)
        ]
        return text, ids, reqs
