"""Grammars compiled against the model's vocabulary in a thread pool, cached by spec.

Compiling (building the token-mask cache for every grammar state) costs milliseconds to
seconds, so it never runs on the engine's loop: ``submit`` returns a future at once and the
request waits (the scheduler skips it, keeping its place) until the future is done. Equal
specs share one future, so ``n > 1`` children and repeated schemas compile once; the cache
keeps the ``cache_size`` most recently used specs.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from octavo.sampling_params import StructuredOutputsParams
from octavo.structured_output.grammar import build_grammar, grammar_key

logger = logging.getLogger(__name__)


class GrammarCompilerPool:
    """Owns the xgrammar ``GrammarCompiler`` (made lazily, in a worker thread: loading the
    tokenizer's vocabulary is itself work the engine loop should not wait for)."""

    def __init__(
        self,
        load_tokenizer: Callable[[], Any],
        vocab_size: int,
        stop_token_ids: list[int],
        max_workers: int = 1,
        cache_size: int = 512,
    ) -> None:
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self.cache_size = cache_size
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="octavo-grammar")
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self._compiler = None
        self._tokenizer = None
        self._lock = threading.Lock()

    def tokenizer(self):
        """The tokenizer, loaded once (from whichever thread asks first)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._load_tokenizer()
            return self._tokenizer

    def _get_compiler(self):
        tok = self.tokenizer()
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                # The request's EOS (the input processor's rule): the tokenizer's, else config's.
                eos = getattr(tok, "eos_token_id", None)
                stops = [eos] if eos is not None else self.stop_token_ids
                info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=self.vocab_size, stop_token_ids=stops or None)
                # octavo's LRU of futures is the cache: xgrammar's own defaults to unbounded.
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def _compile(self, params: StructuredOutputsParams):
        return self._get_compiler().compile_grammar(build_grammar(params))

    def submit(self, params: StructuredOutputsParams) -> Future:
        """A future of the compiled grammar (``CompiledGrammar``; or the compile error)."""
        key = grammar_key(params)
        fut = self._futures.get(key)
        if fut is not None and not (fut.done() and fut.exception() is not None):
            self._futures.move_to_end(key)
            return fut
        fut = self._executor.submit(self._compile, params)
        self._futures[key] = fut
        while len(self._futures) > self.cache_size:
            self._futures.popitem(last=False)
        return fut

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
