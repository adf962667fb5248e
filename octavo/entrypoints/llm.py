"""The offline API: ``LLM(model=...).generate(prompts, sampling_params)``, as in vLLM."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from octavo.engine.arg_utils import EngineArgs
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

    def shutdown(self) -> None:
        """Stop worker processes (tensor parallelism); the LLM cannot be used afterwards."""
        self.llm_engine.core.shutdown()

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
            sampling_params = self.get_default_sampling_params()
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

    def chat(
        self,
        messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to conversations, rendered with the tokenizer's chat template.

        ``messages``: one conversation (a list of ``{"role": ..., "content": ...}``) or a
        list of conversations. Each is rendered to text by ``apply_chat_template`` (with
        ``add_generation_prompt``, so the reply starts as the assistant's turn), tokenized
        without adding special tokens again, and generated exactly as ``generate`` would;
        the outputs are the same ``RequestOutput``s, ``prompt`` holding the rendered text.
        """
        if add_generation_prompt and continue_final_message:
            raise ValueError("add_generation_prompt and continue_final_message cannot both be True")
        if not messages:
            raise ValueError("messages must hold at least one message")
        first = messages[0]
        conversations = [messages] if isinstance(first, dict) else list(messages)
        tok = self.get_tokenizer()
        prompts: list[PromptType] = []
        for conv in conversations:
            if not conv or not all(isinstance(m, dict) and "role" in m for m in conv):
                raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
            try:
                text = tok.apply_chat_template(
                    list(conv),
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    continue_final_message=continue_final_message,
                    chat_template=chat_template,
                    **(chat_template_kwargs or {}),
                )
            except ValueError as e:
                raise ValueError(f"chat_template: cannot render the conversation: {e}") from e
            ids = tok.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams()`` updated with the model's generation_config.json defaults
        (``generation_config="vllm"`` ignores them); what ``generate`` uses when given none."""
        return SamplingParams(**self.llm_engine.config.model_config.sampling_defaults)

    def get_stats(self):
        """Scheduler counters (running/waiting, KV usage, prefix-cache hits, preemptions)."""
        return self.llm_engine.get_stats()

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache; False while requests hold blocks (never between calls)."""
        return self.llm_engine.reset_prefix_cache()

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
