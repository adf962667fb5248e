"""Structured outputs on a GPU: xgrammar's device kernel against the reference mask, and the
shipped model constrained on CUDA (async scheduling on, graphs captured) giving, in float32,
exactly the CPU's greedy outputs, every one valid for its schema, with free requests mixed in.

Kept cheap (it runs beside many xdist workers, and the CPU reference run is the slow half):
12 schemas whose greedy JSON on the shipped model is at most ~40 tokens, chosen to cover
nested objects, arrays with min/max items, enums, string patterns, bounded numbers, null,
booleans and optional fields; 24 requests, engines sized for them (max_num_seqs 32: fewer
graphs to capture)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from tests.structured_output.schemas import make_schemas

HAS_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")


@pytest.mark.cuda
@needs_gpu
def test_bitmask_kernel_on_the_device():
    from octavo.core.sampler import apply_token_bitmask_reference, apply_token_bitmask_xgrammar

    g = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (64, 4096 // 32), dtype=torch.int32, generator=g).cuda()
    logits = torch.randn(64, 4096, generator=g).cuda()
    rows = list(range(0, 64, 3))
    a, b = logits.clone(), logits.clone()
    apply_token_bitmask_xgrammar(a, rows, bitmask)
    apply_token_bitmask_reference(b, rows, bitmask)
    assert torch.equal(a, b)
    a, b = logits.clone(), logits.clone()
    apply_token_bitmask_xgrammar(a, list(range(64)), bitmask)
    apply_token_bitmask_reference(b, list(range(64)), bitmask)
    assert torch.equal(a, b)


SCHEMAS = [3, 4, 8, 10, 13, 14, 16, 21, 24, 26, 28, 31]  # of make_schemas(32, seed=11)


def _run(platform: str, monkeypatch):
    from octavo import LLM, SamplingParams
    from octavo.platforms import reset_current_platform
    from octavo.sampling_params import StructuredOutputsParams

    monkeypatch.setenv("OCTAVO_PLATFORM", platform)
    reset_current_platform()
    try:
        llm = LLM(dtype="float32", max_num_seqs=32, max_model_len=256,
                  structured_outputs_config={"disable_any_whitespace": True})
        every = make_schemas(32, seed=11)
        schemas = [every[i] for i in SCHEMAS]
        prompts, params = [], []
        for s in schemas:
            prompts += ["def parse(data):", "# free text\n"]
            params += [SamplingParams(max_tokens=64, temperature=0, structured_outputs=StructuredOutputsParams(json=s)),
                       SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return llm, schemas, [o.outputs[0].text for o in outs]
    finally:
        monkeypatch.delenv("OCTAVO_PLATFORM")
        reset_current_platform()


@pytest.mark.cuda
@needs_gpu
def test_constrained_generation_on_cuda_matches_cpu(monkeypatch):
    _, schemas, cpu = _run("cpu", monkeypatch)
    llm, _, gpu = _run("cuda", monkeypatch)
    assert llm.llm_engine.core.async_scheduling
    assert gpu == cpu
    assert len(schemas) == len(SCHEMAS)
    for text, schema in zip(gpu[::2], schemas, strict=True):
        jsonschema.validate(json.loads(text), schema)
