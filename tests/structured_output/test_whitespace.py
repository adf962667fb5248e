"""Free whitespace in JSON (``any_whitespace``, xgrammar's and vLLM's default) with the shipped
model. The model learned Python, so under a JSON Schema it pads with newlines and indentation
and often runs into ``max_tokens``; ``disable_any_whitespace`` is the cure (the other
structured-output tests use it). This module shows the padding is the model's choice and not
a leak in octavo's mask: greedy float32 tokens are identical to HF transformers ``generate``
on the same checkpoint with xgrammar's own HF logits processor and the same grammar."""

from __future__ import annotations

import pytest
import torch
import transformers
import xgrammar as xgr
from xgrammar.contrib.hf import LogitsProcessor

from octavo import LLM, SamplingParams
from octavo.engine.model_files import DEFAULT_MODEL_DIR
from octavo.sampling_params import StructuredOutputsParams
from tests.structured_output.schemas import make_schemas

PROMPTS = ["def parse(data):", "Return the record as JSON:", "# config\n", "class Item:"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def hf():
    tok = transformers.AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    model = transformers.AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, dtype=torch.float32).eval()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size,
                                              stop_token_ids=[tok.eos_token_id])
    return tok, model, xgr.GrammarCompiler(info, max_threads=1)


def _hf_tokens(hf, prompt_ids: list[int], schema: dict) -> list[int]:
    tok, model, compiler = hf
    proc = LogitsProcessor(compiler.compile_json_schema(schema, any_whitespace=True))
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                             logits_processor=[proc], pad_token_id=tok.eos_token_id)
    ids = out[0, len(prompt_ids):].tolist()
    return ids[: ids.index(tok.eos_token_id)] if tok.eos_token_id in ids else ids


def test_free_whitespace_padding_is_the_model_not_the_mask(hf):
    tok = hf[0]
    schemas = make_schemas(8, seed=5)
    prompts = [tok(PROMPTS[i % 4]).input_ids for i in range(len(schemas))]
    llm = LLM(dtype="float32")  # default config: any whitespace, as vLLM
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                             structured_outputs=StructuredOutputsParams(json=s)) for s in schemas]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    padded = 0
    for out, p, s in zip(outs, prompts, schemas, strict=True):
        ids = [t for t in out.outputs[0].token_ids if t != tok.eos_token_id]
        assert ids == _hf_tokens(hf, p, s), out.outputs[0].text
        padded += any(tok.decode([t]).strip() == "" for t in ids)
    assert padded, "expected the shipped model to pad free-whitespace JSON"
