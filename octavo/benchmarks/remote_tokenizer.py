"""A tokenizer that asks the server: ``POST /tokenize`` and ``POST /detokenize`` (vLLM's routes).

``octavo bench serve`` uses it when no local tokenizer matches the served model, so any octavo
or vLLM server can be benchmarked without a copy of its tokenizer. It offers what the
benchmark needs of a Hugging Face tokenizer: ``encode``, ``decode``, ``len()`` and
``all_special_ids``. The vocabulary size is not reported by ``/v1/models``, so it is found by a
binary search over ``/detokenize``, which rejects ids outside ``[0, vocab)``; special ids are
unknown (an empty list), so random prompts may contain some.
"""

from __future__ import annotations

from typing import Any


class RemoteTokenizer:
    """Tokenize through a running server (synchronous; prompts are built before the load)."""

    all_special_ids: list[int] = []

    def __init__(self, base_url: str, model: str, timeout: float = 30.0) -> None:
        import httpx

        self.base_url, self.model = base_url.rstrip("/"), model
        self._client = httpx.Client(timeout=timeout)
        self._vocab: int | None = None
        self.encode("probe")  # fail now, with the reason, if the server has no /tokenize

    def _post(self, route: str, body: dict[str, Any]) -> Any:
        r = self._client.post(f"{self.base_url}{route}", json={"model": self.model, **body})
        if r.status_code != 200:
            raise ValueError(f"{self.base_url}{route} answered {r.status_code}: {r.text[:200]}")
        return r.json()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._post("/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})["tokens"]

    def decode(self, ids: list[int], **_: Any) -> str:
        return self._post("/detokenize", {"tokens": list(ids)})["prompt"]

    def _valid(self, token_id: int) -> bool:
        r = self._client.post(f"{self.base_url}/detokenize", json={"model": self.model, "tokens": [token_id]})
        return r.status_code == 200

    def __len__(self) -> int:
        """The vocabulary size: the first id ``/detokenize`` rejects (about 2 log2(vocab) calls)."""
        if self._vocab is None:
            hi = 1
            while self._valid(hi) and hi < 1 << 24:
                hi *= 2
            lo = hi // 2  # lo is valid (or 0), hi is not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self._valid(mid) else (lo, mid)
            self._vocab = hi
        return self._vocab
