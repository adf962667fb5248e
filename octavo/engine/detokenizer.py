"""Incremental detokenization with stop strings.

Text grows one token at a time through ``tokenizers``' ``DecodeStream``, which holds back
bytes of a multi-byte character split across tokens. Stop strings are searched only in the
region new text can affect; on a match the text is cut there (keeping the stop string when
``include_stop_str_in_output``). ``get_delta`` / ``get_text`` hold back the last
``max(len(stop)) - 1`` characters while unfinished: they could still turn out to be the start of
a stop string, so a streamed client never sees text that is later retracted. With
``include_stop_str_in_output`` nothing is held back: a match always ends in new text, so the
cut never reaches text already shown.
Invariant: ``text`` never contains a U+FFFD produced by a character split across tokens
(those bytes wait in the stream until the character is complete).

``final_only`` (an output read only once finished, with no stop strings): nothing is decoded
until ``finish``, which decodes the whole sequence once, the text a streamed request ends
with too. Offline batches skip a tokenizer call per token per step this way.
"""

from __future__ import annotations

from octavo.sampling_params import SamplingParams


class IncrementalDetokenizer:
    def __init__(self, tokenizer, params: SamplingParams, final_only: bool = False) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.stop = list(params.stop or [])
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        # Characters that may still be retracted by a stop-string cut.
        self.hold_back = 0 if params.include_stop_str_in_output else max(0, self.max_stop_len - 1)
        self.text = ""
        self.token_ids: list[int] = []
        self._sent = 0  # characters already returned by get_delta
        self._stream = None
        self._deferred = final_only and not self.stop and params.detokenize
        backend = getattr(tokenizer, "_tokenizer", None) or getattr(tokenizer, "backend_tokenizer", None)
        if params.detokenize and backend is not None and not self._deferred:
            from tokenizers.decoders import DecodeStream

            self._backend = backend
            self._stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)

    def update(self, new_token_ids: list[int]) -> str | None:
        """Append tokens; return the matched stop string if the text now hits one."""
        self.token_ids.extend(new_token_ids)
        if not self.params.detokenize or self._deferred:
            return None
        start = len(self.text)
        if self._stream is not None:
            for t in new_token_ids:
                chunk = self._stream.step(self._backend, t)
                if chunk:
                    self.text += chunk
        else:  # slow tokenizers: re-decode (quadratic, but correct)
            text = self._decode_all()
            if not text.endswith("\ufffd"):
                self.text = text
        if not self.stop or len(self.text) == start:
            return None
        search_from = max(0, start - self.max_stop_len + 1)
        best = None
        for s in self.stop:
            i = self.text.find(s, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.text = self.text[: i + len(s)] if self.params.include_stop_str_in_output else self.text[:i]
        return s

    def finish(self, stopped_by_string: bool) -> None:
        """Flush bytes held back for an incomplete character (decoded as U+FFFD, as HF does)."""
        if self._deferred:
            self.text = self._decode_all()
            return
        if stopped_by_string or self._stream is None or not self.params.detokenize:
            return
        full = self._decode_all()
        if full.startswith(self.text):
            self.text = full

    def _decode_all(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=self.params.skip_special_tokens)

    def get_text(self, finished: bool) -> str:
        """All text that is safe to show (everything once finished)."""
        if finished or not self.hold_back:
            return self.text
        return self.text[: max(self._sent, len(self.text) - self.hold_back)]

    def get_delta(self, finished: bool) -> str:
        """Text not returned before; holds back a possible stop-string prefix unless finished."""
        end = len(self.text)
        if not finished and self.hold_back:
            end = max(self._sent, end - self.hold_back)
        delta = self.text[self._sent : end]
        self._sent = end
        return delta
