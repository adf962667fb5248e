"""A speculative head's copies of tensors it takes from the target (embedding, lm_head).

EAGLE checkpoints often carry a copy of the target's embedding; the head drafts with the
target's own. A copy is checked and dropped, never ignored unchecked.
"""

from __future__ import annotations

import torch
from torch import nn


def split_shared_copy(target: nn.Module, shared: tuple[str, ...], name: str, tensor: torch.Tensor):
    """The loader's ``split_checkpoint_tensor`` for a head that drafts with the target's
    embedding / lm_head: a copy of one of ``shared`` in the head's checkpoint is checked against
    the target's tensor and dropped; a copy that differs is an error naming it (it would be
    ignored otherwise). Every other tensor passes through."""
    bare = name[len("model."):] if name.startswith("model.") else name
    if bare not in shared:
        return ((name, tensor),)
    own = getattr(target.model.embed_tokens if bare.startswith("embed") else target.lm_head, "weight", None)
    same = (own is not None and own.shape == tensor.shape
            and torch.allclose(own.detach().float().cpu(), tensor.float(), rtol=1e-2, atol=1e-3))
    if not same:
        raise ValueError(
            f"tensor {name!r}: the head's copy differs from the target's (or the target's cannot be "
            f"read to compare); octavo's head drafts with the target's {bare}, so a different one "
            "would be silently ignored"
        )
    return ()
