"""The dummy platform's own attention backend: torch_ref's kernels under the name ``dummy_attn``."""

from __future__ import annotations

from octavo.attention.backends.torch_ref import TorchRefBackend, TorchRefImpl


class DummyAttentionImpl(TorchRefImpl):
    pass


class DummyAttentionBackend(TorchRefBackend):
    name = "dummy_attn"
    supported_device_types = ("cpu",)

    @classmethod
    def get_impl_cls(cls):
        return DummyAttentionImpl
