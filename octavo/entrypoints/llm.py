"""The offline API: ``LLM(model=...).generate(prompts, sampling_params)``, as in vLLM."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from octavo.config import EngineArgs
from octavo.engine.llm_engine import LLMEngine
from octavo.engine.output_processor import OutputKind
from octavo.engine.processor import PromptType
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams


class LLM:
    """Offline batched generation. Keyword arguments are ``EngineArgs`` fields (vLLM names)."""

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        self.engine_args = EngineArgs(model=model, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(self.engine_args)
        self._counter = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in input order.

        ``prompts``: a string, a ``{"prompt_token_ids": [...]}`` dict, or a list of those.
        ``sampling_params``: one for all prompts or one per prompt. All prompts are validated
        before any is scheduled; a bad one raises ``ValueError`` and nothing runs.
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"got {len(params_list)} sampling params for {len(prompts)} prompts; "
                    "give one for all or one per prompt"
                )
        if priority is not None and len(priority) != len(prompts):
            raise ValueError("priority must have one entry per prompt")
        engine = self.llm_engine
        # Validate everything first so a bad prompt schedules nothing.
        for p, sp in zip(prompts, params_list, strict=True):
            _, ids = engine.processor.tokenize(p)
            engine.processor.validate(ids, sp)
        ids = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, params_list, strict=True)):
                rid = str(next(self._counter))
                engine.add_request(rid, p, sp, priority=priority[i] if priority else 0, output_kind=OutputKind.FINAL_ONLY)
                ids.append(rid)
            return self._run_engine(ids, use_tqdm)
        except BaseException:
            engine.abort_request(ids)
            raise

    def _run_engine(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        results: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm and len(ids) > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    results[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [results[i] for i in ids]
