"""Mixture-of-experts under tensor parallelism on the CPU (gloo): TP=2 with experts sharded
like dense MLPs, and TP=2 with ``--enable-expert-parallel`` (4 whole experts per rank), both
greedy-identical to TP=1 in float32."""

import pytest

from octavo import LLM, SamplingParams
from tests.conftest import MOE_ARCHS
from tests.hf_reference import random_prompts

LENGTHS = [1, 17, 40, 90]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8)


PLACEMENT = {
    (1, False): ["all 8 experts"],
    (2, False): ["all 8 experts, {i} of {I} rows each (tensor-sharded)"] * 2,
    (2, True): ["experts 0-3 of 8 on rank 0 (expert parallel)", "experts 4-7 of 8 on rank 1 (expert parallel)"],
}


def _generate(path: str, tp: int, ep: bool = False) -> list[list[int]]:
    llm = LLM(path, dtype="float32", tensor_parallel_size=tp, enable_expert_parallel=ep,
              max_num_batched_tokens=64, max_num_seqs=3)
    # Every rank built its experts the way the flags ask.
    inter = llm.llm_engine.config.model_config.hf_config
    inter = getattr(inter, "moe_intermediate_size", None) or inter.intermediate_size
    infos = llm.llm_engine.core.executor.worker_infos
    assert len(infos) == tp
    for info, where in zip(infos, PLACEMENT[(tp, ep)], strict=True):
        assert f"top-2 of {where.format(i=inter // 2, I=inter)};" in info["moe"], info["moe"]
    vocab = llm.llm_engine.config.model_config.vocab_size
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, LENGTHS, seed=11)]
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.usefixtures("cpu_platform")
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_tp2_and_expert_parallel_match_tp1(arch, checkpoints):
    path = checkpoints[arch]
    reference = _generate(path, 1)
    assert _generate(path, 2) == reference
    assert _generate(path, 2, ep=True) == reference


@pytest.mark.usefixtures("cpu_platform")
def test_expert_parallel_refused_for_dense_models(llama_dir):
    with pytest.raises(ValueError, match="enable-expert-parallel.*no experts"):
        LLM(llama_dir, enable_expert_parallel=True)


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe"])
def test_moe_tp2_and_expert_parallel_on_two_gpus(arch, checkpoints):
    """NCCL and the Triton kernels: fp32 TP=2 and TP=2+EP greedy tokens equal TP=1's."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    path = checkpoints[arch]
    reference = _generate(path, 1)
    assert _generate(path, 2) == reference
    assert _generate(path, 2, ep=True) == reference


@pytest.mark.usefixtures("cpu_platform")
def test_experts_that_do_not_split_over_the_ranks_are_refused_early(checkpoints):
    from octavo.engine.arg_utils import EngineArgs

    path = checkpoints["qwen3_moe"]  # 8 experts, I=48
    with pytest.raises(ValueError, match="8 experts do not divide over --tensor-parallel-size"):
        EngineArgs(model=path, tensor_parallel_size=3, enable_expert_parallel=True).create_engine_config()
    with pytest.raises(ValueError, match=r"intermediate size \(48\) is not divisible.*5; try --enable-expert-parallel"):
        EngineArgs(model=path, tensor_parallel_size=5).create_engine_config()
