"""User-facing sampling parameters, field names and meanings as in vLLM.

How each field acts on the logits, and in which order, is documented in
``octavo/core/sampler.py``. ``top_k`` 0 and -1 both disable top-k; greedy (temperature 0)
resets ``top_p``/``top_k``/``min_p`` to their neutral values.

Invariants after ``__post_init__``: every numeric field lies in its documented range, ``stop``
is a list of non-empty strings, ``stop_token_ids`` a list of ints; a ``ValueError`` names the
offending field and its allowed range otherwise. Checks that need the model (token ids inside
the vocabulary, prompt + max_tokens within the context) happen in the input processor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

_SAMPLING_EPS = 1e-5


STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """A constraint on the generated text, as vLLM names it: exactly one of the kinds is set.

    ``json``: a JSON Schema (dict or JSON text); ``regex``: a regular expression the whole output
    matches; ``choice``: the output is one of these strings; ``grammar``: an EBNF (GBNF) grammar
    whose start rule is ``root``; ``json_object``: any JSON object; ``structural_tag``: xgrammar's
    structural tag (dict or JSON text). ``disable_any_whitespace``: JSON without free whitespace
    between tokens (small models otherwise tend to fill it with newlines).
    Whether the constraint compiles is checked by the input processor, not here.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        if self.json_object is False:
            self.json_object = None
        kinds = [k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"structured_outputs must set exactly one of {', '.join(STRUCTURED_OUTPUT_KINDS)}; "
                f"got {', '.join(kinds) if kinds else 'none'}"
            )
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice or not all(
                isinstance(c, str) for c in self.choice
            ):
                raise ValueError("structured_outputs.choice must be a non-empty list of strings")
            self.choice = list(self.choice)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")

    @property
    def kind(self) -> str:
        """Which constraint is set (one of ``STRUCTURED_OUTPUT_KINDS``)."""
        return next(k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) is not None)


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    # Filled by the input processor: token-id sequences of ``bad_words``.
    _bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        else:
            raise ValueError(f"stop must be a string or a list of strings, got {type(self.stop).__name__}")
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        else:
            self.stop_token_ids = list(self.stop_token_ids)
        if isinstance(self.structured_outputs, dict):  # rebuilt after msgpack, or from kwargs
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(
                "structured_outputs must be StructuredOutputsParams, got "
                f"{type(self.structured_outputs).__name__}"
            )
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError, AttributeError) as e:
                raise ValueError(
                    "logit_bias must map token ids (int) to biases (float)"
                ) from e
        self._verify()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the other sampling knobs are irrelevant; normalise them.
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0

    def verify(self) -> None:
        """Raise ValueError naming the first field outside its range (run at construction, and
        by the engine on every request, since fields may be changed after construction)."""
        self._verify()

    def _verify(self) -> None:
        def bad(name: str, rng: str, value: object) -> ValueError:
            return ValueError(f"{name} must be {rng}, got {value!r}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "an integer >= 1", self.n)
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise bad(name, "a number", value)
        if self.temperature < 0.0 or not math.isfinite(self.temperature):
            raise bad("temperature", "a finite number >= 0 (0 means greedy)", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]", self.top_p)
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "-1 or 0 (disabled) or a positive integer", self.top_k)
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]", self.min_p)
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]", self.presence_penalty)
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]", self.frequency_penalty)
        if not self.repetition_penalty > 0.0 or not math.isfinite(self.repetition_penalty):
            raise bad("repetition_penalty", "a finite number > 0 (1 means none)", self.repetition_penalty)
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "an integer >= 1", self.max_tokens)
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "an integer >= 0", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "an integer or None", self.seed)
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise bad("logprobs", "an integer >= 0 or None", self.logprobs)
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int) or self.prompt_logprobs < 0
        ):
            raise bad("prompt_logprobs", "an integer >= 0 or None", self.prompt_logprobs)
        for s in self.stop:
            if not isinstance(s, str):
                raise ValueError(f"stop must be a list of strings, got an item {s!r}")
            if not s:
                raise ValueError("stop must not contain an empty string")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool):
                raise bad("stop_token_ids", "a list of integers", self.stop_token_ids)
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty")
            for t in self.allowed_token_ids:
                if not isinstance(t, int) or isinstance(t, bool):
                    raise bad("allowed_token_ids", "a list of integers", self.allowed_token_ids)
        if self.logit_bias is not None:
            for t, b in self.logit_bias.items():
                if math.isnan(b):
                    raise bad("logit_bias", "a map of token ids to numbers (not NaN)", {t: b})
        if self.bad_words is not None:
            if not isinstance(self.bad_words, (list, tuple)):
                raise bad("bad_words", "a list of non-empty strings", self.bad_words)
            for w in self.bad_words:
                if not isinstance(w, str) or not w:
                    raise bad("bad_words", "a list of non-empty strings", self.bad_words)

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    @property
    def needs_output_history(self) -> bool:
        """Sampling reads this request's generated token ids (penalties, bad words, or the
        structured-output matcher, whose next token mask depends on every accepted token).

        Such a request cannot sample while its previous token is still on the device, so the
        engine does not overlap steps (async scheduling) while one is running.
        """
        return (
            self.structured_outputs is not None
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
            or bool(self._bad_words_token_ids)
        )

    @property
    def bad_words_token_ids(self) -> list[list[int]]:
        """Token-id sequences of ``bad_words`` (filled in by the input processor)."""
        return self._bad_words_token_ids

    def clone(self) -> SamplingParams:
        import copy

        return copy.deepcopy(self)
