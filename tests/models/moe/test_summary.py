"""``moe_cost`` counts exactly the parameters transformers builds, and the active ones a
decode token reads."""

import pytest

from octavo.models.moe.summary import moe_cost
from tests.conftest import MOE_ARCHS


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_total_parameters_match_transformers(arch, checkpoints):
    from tests.hf_reference import hf_model

    model = hf_model(checkpoints[arch])
    cost = moe_cost(model.config)
    assert cost.total_params == sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert cost.expert_params == experts
    # One rank of one: everything; active = all but the experts a token skips and the embedding.
    assert cost.params_per_rank == cost.total_params
    spec_k, spec_e = model.config.num_experts_per_tok, getattr(model.config, "num_experts", None) or model.config.num_local_experts
    skipped = experts * (spec_e - spec_k) // spec_e
    assert cost.active_params == cost.total_params - skipped - model.config.vocab_size * model.config.hidden_size


@pytest.mark.parametrize("arch", MOE_ARCHS)
@pytest.mark.parametrize("expert_parallel", [False, True])
def test_per_rank_parameters_match_a_built_rank(arch, expert_parallel, checkpoints, monkeypatch):
    """Rank 1 of 2, built for real (layers only read rank and world size while building)."""
    import torch

    from octavo.attention.backends.torch_ref import TorchRefBackend
    from octavo.distributed import parallel_state
    from octavo.distributed.communicator import create_communicator
    from octavo.models.registry import resolve_architecture
    from tests.hf_reference import hf_model

    cfg = hf_model(checkpoints[arch]).config
    monkeypatch.setattr(parallel_state, "_TP", create_communicator("gloo", None, 1, 2))
    monkeypatch.setattr(parallel_state, "_EXPERT_PARALLEL", expert_parallel)
    _, cls = resolve_architecture(cfg.architectures)
    model = cls(cfg, TorchRefBackend, torch.float32, 64)
    built = sum(p.numel() for p in model.parameters())
    expected = moe_cost(cfg, 2).params_per_rank
    assert built == expected
