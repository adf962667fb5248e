"""Mixtral, Qwen2-MoE and Qwen3-MoE: greedy outputs token-identical to transformers in float32.

Tiny fixtures (8 experts, top-2; Qwen2-MoE with a shared expert and a dense layer through
``mlp_only_layers``) written by transformers itself, so the per-expert checkpoint layout is the
one real checkpoints use. Chunked prefill and queueing are forced as in the dense test.
"""

import pytest

from octavo import LLM, SamplingParams
from tests.conftest import MOE_ARCHS
from tests.hf_reference import hf_greedy, random_prompts

LENGTHS = [1, 16, 17, 40, 100]
MAX_TOKENS = 10


@pytest.mark.usefixtures("cpu_platform")
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_greedy_matches_transformers(arch, checkpoints):
    path = checkpoints[arch]
    llm = LLM(path, dtype="float32", block_size=16, max_num_batched_tokens=64, max_num_seqs=3)
    vocab = llm.llm_engine.config.model_config.vocab_size
    prompts = random_prompts(vocab, LENGTHS, seed=sum(map(ord, arch)))
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        use_tqdm=False,
    )
    for p, o in zip(prompts, outs, strict=True):
        assert o.outputs[0].token_ids == hf_greedy(path, p, MAX_TOKENS), f"{arch}: prompt of {len(p)} tokens"
    llm.shutdown()


def test_moe_structure_follows_config(checkpoints):
    """Qwen2-MoE: layer 1 is dense (mlp_only_layers), the others sparse with a shared expert."""
    import torch

    from octavo.attention.backends.torch_ref import TorchRefBackend
    from octavo.models.llama import LlamaMLP
    from octavo.models.llama_moe import SparseMoeBlock
    from octavo.models.loader import load_weights
    from octavo.models.registry import resolve_architecture
    from tests.hf_reference import hf_model

    path = checkpoints["qwen2_moe"]
    hf = hf_model(path)
    _, cls = resolve_architecture(hf.config.architectures)
    model = cls(hf.config, TorchRefBackend, torch.float32, 64)
    load_weights(model, path)
    kinds = [type(layer.mlp) for layer in model.model.layers]
    assert kinds == [SparseMoeBlock, LlamaMLP, SparseMoeBlock]
    moe = model.model.layers[0].mlp
    ref = hf.model.layers[0].mlp
    assert moe.experts.w13_weight.shape == (8, 96, 64)
    # Stacked at load: expert 5's up rows are the checkpoint's experts.5.up_proj.
    assert torch.equal(moe.experts.w13_weight[5, 48:], ref.experts.gate_up_proj[5, 48:])
    assert torch.equal(moe.experts.w2_weight[3], ref.experts.down_proj[3])
    x = torch.randn(7, 64)
    torch.testing.assert_close(moe(x), ref(x[None])[0], rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("cpu_platform")
def test_quantized_moe_checkpoint_is_refused(checkpoints, tmp_path):
    """A MoE checkpoint with a quantization_config is refused before any weight is read."""
    import json
    import shutil

    src = checkpoints["qwen3_moe"]
    dst = tmp_path / "fp8_moe"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="quantiz"):
        LLM(str(dst), dtype="float32")


def test_moe_model_refuses_quantization_config_directly(checkpoints):
    import torch

    from octavo.attention.backends.torch_ref import TorchRefBackend
    from octavo.models.llama_moe import Qwen3MoeForCausalLM
    from tests.hf_reference import hf_model

    cfg = hf_model(checkpoints["qwen3_moe"]).config
    cfg = type(cfg).from_dict({**cfg.to_dict(), "quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(ValueError, match="quantized mixture-of-experts checkpoints are not supported.*'fp8'"):
        Qwen3MoeForCausalLM(cfg, TorchRefBackend, torch.float32, 64)


@pytest.mark.cuda
@pytest.mark.parametrize("arch", MOE_ARCHS)
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_moe_fp32_on_gpu_identical_to_cpu(arch, enforce_eager, checkpoints, monkeypatch):
    """The Triton grouped kernel inside the engine (captured CUDA graphs or eager) in fp32
    gives the CPU's greedy tokens."""
    from tests.worker.test_cuda_graph import HAS_GPU, _generate

    if not HAS_GPU:
        pytest.skip("needs a GPU")
    _, _, cpu_tokens = _generate(checkpoints[arch], monkeypatch, "cpu", dtype="float32")
    llm, _, gpu_tokens = _generate(
        checkpoints[arch], monkeypatch, "cuda", dtype="float32", enforce_eager=enforce_eager
    )
    assert "kernel triton_grouped" in llm.llm_engine.core.executor.worker_infos[0]["moe"]
    assert (llm.llm_engine.core.runner.graph_runner is None) == enforce_eager
    assert gpu_tokens == cpu_tokens


@pytest.mark.usefixtures("cpu_platform")
def test_moe_refused_even_when_the_method_exists_for_dense_models(checkpoints, tmp_path, monkeypatch):
    """Once a method is registered (dense layers), MoE checkpoints using it are still refused:
    the expert kernels have no quantized path."""
    import json
    import shutil

    from octavo import quantization
    from octavo.platforms.cpu import CpuPlatform

    monkeypatch.setitem(quantization.QUANTIZATION_METHODS, "fp8", "octavo.quantization.fp8.Fp8Method")
    monkeypatch.setattr(CpuPlatform, "supported_quantization", ("fp8",))
    dst = tmp_path / "fp8_moe"
    shutil.copytree(checkpoints["mixtral"], dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8"}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="'fp8' is not supported for mixture-of-experts models"):
        LLM(str(dst), dtype="float32")
    with pytest.raises(ValueError, match="'fp8' is not supported for mixture-of-experts models"):
        LLM(checkpoints["mixtral"], dtype="float32", quantization="fp8")
