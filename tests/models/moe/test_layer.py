"""``FusedMoE`` placement and loading: tensor-sharded vs expert-parallel slices of the stacked
expert weights, the local id mapping, and clear errors for bad or missing expert tensors."""

from __future__ import annotations

import pytest
import torch

from octavo.distributed import parallel_state
from octavo.distributed.communicator import create_communicator
from octavo.models.moe.layer import FusedMoE

E, H, INTER = 8, 16, 12


@pytest.fixture
def rank_of_two(monkeypatch):
    """Pretend to be rank 1 of a 2-rank group (layers only read rank and world size)."""

    def use(expert_parallel: bool):
        monkeypatch.setattr(parallel_state, "_TP", create_communicator("gloo", None, 1, 2))
        monkeypatch.setattr(parallel_state, "_EXPERT_PARALLEL", expert_parallel)

    return use


def full_weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(E, INTER, H, generator=g)
    up = torch.randn(E, INTER, H, generator=g)
    down = torch.randn(E, H, INTER, generator=g)
    return gate, up, down


def load_all(layer: FusedMoE, gate, up, down):
    for e in range(E):
        layer.w13_weight.weight_loader(layer.w13_weight, gate[e], f"{e}.gate")
        layer.w13_weight.weight_loader(layer.w13_weight, up[e], f"{e}.up")
        layer.w2_weight.weight_loader(layer.w2_weight, down[e], f"{e}.down")


def test_single_rank_stacks_every_expert():
    layer = FusedMoE(E, 2, H, INTER, True, torch.float32)
    gate, up, down = full_weights()
    load_all(layer, gate, up, down)
    assert torch.equal(layer.w13_weight.data, torch.cat([gate, up], dim=1))
    assert torch.equal(layer.w2_weight.data, down)
    assert layer.describe().startswith("top-2 of all 8 experts; kernel ")
    ids = torch.tensor([[0, 7]])
    assert torch.equal(layer.local_expert_ids(ids), ids)


def test_tensor_sharded_rank_keeps_its_rows(rank_of_two):
    rank_of_two(False)
    layer = FusedMoE(E, 2, H, INTER, True, torch.float32)
    gate, up, down = full_weights()
    load_all(layer, gate, up, down)
    half = INTER // 2
    assert layer.w13_weight.shape == (E, 2 * half, H)
    assert torch.equal(layer.w13_weight.data, torch.cat([gate[:, half:], up[:, half:]], dim=1))
    assert torch.equal(layer.w2_weight.data, down[:, :, half:])
    assert "6 of 12 rows each (tensor-sharded)" in layer.describe()


def test_expert_parallel_rank_holds_whole_experts(rank_of_two):
    rank_of_two(True)
    layer = FusedMoE(E, 2, H, INTER, True, torch.float32)
    gate, up, down = full_weights()
    load_all(layer, gate, up, down)  # experts 0-3 are accepted and dropped
    assert layer.w13_weight.shape == (4, 2 * INTER, H)
    assert torch.equal(layer.w13_weight.data, torch.cat([gate[4:], up[4:]], dim=1))
    assert torch.equal(layer.w2_weight.data, down[4:])
    ids = torch.tensor([[0, 4], [7, 3]])
    assert layer.local_expert_ids(ids).tolist() == [[4, 0], [3, 4]]  # 4 = not on this rank
    assert "experts 4-7 of 8 on rank 1 (expert parallel)" in layer.describe()


def test_expert_parallel_needs_divisible_experts(rank_of_two):
    rank_of_two(True)
    with pytest.raises(ValueError, match="enable-expert-parallel.*7 experts"):
        FusedMoE(7, 2, H, INTER, True, torch.float32)


def test_bad_expert_tensors_are_refused():
    layer = FusedMoE(E, 2, H, INTER, True, torch.float32)
    w13 = layer.w13_weight
    with pytest.raises(ValueError, match="expected"):
        w13.weight_loader(w13, torch.zeros(INTER + 1, H), "0.gate")
    with pytest.raises(ValueError, match="expert shard '9.gate'"):
        w13.weight_loader(w13, torch.zeros(INTER, H), "9.gate")
    with pytest.raises(ValueError, match="not a gate or up"):
        w13.weight_loader(w13, torch.zeros(INTER, H), "0.down")


def test_missing_expert_tensor_fails_the_load(checkpoints, tmp_path):
    """A checkpoint without one expert's up projection names exactly that tensor."""
    import shutil

    from safetensors.torch import load_file, save_file

    from octavo import LLM

    src = checkpoints["qwen3_moe"]
    dst = tmp_path / "missing_expert"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts\.w13_weight\[5\.up\]"):
        LLM(str(dst), dtype="float32")
