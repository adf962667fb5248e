"""LLM.chat renders conversations with the tokenizer's chat template and generates."""

import pytest

from octavo import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, dtype="float32", max_model_len=256)


CONV = [
    {"role": "system", "content": "the engine"},
    {"role": "user", "content": "hello world"},
]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def test_chat_equals_generate_on_the_rendered_prompt(llm):
    out = llm.chat(CONV, GREEDY, use_tqdm=False)
    assert len(out) == 1
    expected_prompt = (
        "<|im_start|>system\nthe engine<|im_end|>\n"
        "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out[0].prompt == expected_prompt
    tok = llm.get_tokenizer()
    ids = tok.encode(expected_prompt, add_special_tokens=False)
    assert out[0].prompt_token_ids == ids
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids  # special tokens parsed, not spelled
    ref = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert out[0].outputs[0].token_ids == ref.outputs[0].token_ids
    assert out[0].outputs[0].text == ref.outputs[0].text


def test_chat_batch_and_generation_prompt_flag(llm):
    convs = [CONV, [{"role": "user", "content": "import data"}]]
    outs = llm.chat(convs, [GREEDY, GREEDY], use_tqdm=False)
    assert len(outs) == 2 and outs[1].prompt.endswith("<|im_start|>assistant\n")
    raw = llm.chat(convs[1], GREEDY, add_generation_prompt=False, use_tqdm=False)[0]
    assert raw.prompt == "<|im_start|>user\nimport data<|im_end|>\n"


def test_chat_bad_input(llm):
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(CONV, GREEDY, continue_final_message=True, use_tqdm=False)
    with pytest.raises(ValueError, match="messages"):
        llm.chat([], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="messages"):
        llm.chat([["not a dict"]], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
