"""Fixtures of the speculative decoding tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def small_draft_dir(tmp_path_factory, tokenizer_dir) -> str:
    """A one-layer, narrower Llama with the fixtures' tokenizer (a draft cheaper than any target)."""
    from tests.fixtures.checkpoints import build_llama

    out = build_llama(tmp_path_factory.mktemp("small_draft"), tokenizer_dir, seed=5, hidden_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                      max_position_embeddings=2048, initializer_range=0.2, tie_word_embeddings=True)
    return str(out)


@pytest.fixture(scope="session")
def eagle_heads(tmp_path_factory, checkpoints):
    """(arch, kind) -> an EAGLE head of the fixture ``arch`` (built lazily, once): kind
    ``random`` (seed 0), ``bias`` (random, with an ``fc.bias``) or ``identity`` (drafts the
    target's own greedy token at the head's position; see ``build_eagle_head``)."""
    from pathlib import Path

    from tests.fixtures.checkpoints import build_eagle_head

    root = tmp_path_factory.mktemp("eagle_heads")
    cache: dict[tuple[str, str], str] = {}

    class _Lazy(dict):
        def __getitem__(self, key):
            arch, kind = key
            if key not in cache:
                cache[key] = str(build_eagle_head(Path(checkpoints[arch]), root / f"{arch}-{kind}",
                                                  identity=kind == "identity", fc_bias=kind == "bias"))
            return cache[key]

    return _Lazy()


@pytest.fixture(scope="session")
def attention_free_target(tmp_path_factory, llama_dir):
    """The llama fixture (2 layers) with every ``o_proj`` zero: a token's hidden state depends
    on that token only. Its mirror head (``fc`` selects the embedding; the target's two layers,
    the first without its input norm) computes at position ``i`` what the target computes at
    ``i + 1``, so (with the final norm's weights 1: a positive scale, the same argmax) every
    draft is the target's next greedy token."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("attention_free")
    shutil.copytree(llama_dir, out, dirs_exist_ok=True)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    tensors = load_file(str(out / "model.safetensors"))
    for i in range(2):
        tensors[f"model.layers.{i}.self_attn.o_proj.weight"].zero_()
    assert torch.all(tensors["model.norm.weight"] == 1)
    save_file(tensors, str(out / "model.safetensors"))
    head = tmp_path_factory.mktemp("mirror_head")
    h = cfg["hidden_size"]
    own = {k[len("model."):]: v for k, v in tensors.items()
           if k.startswith("model.layers.") and not k.startswith("model.layers.0.input_layernorm")}
    own["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    save_file(own, str(head / "model.safetensors"))
    cfg["architectures"] = ["EagleLlamaForCausalLM"]
    (head / "config.json").write_text(json.dumps(cfg))
    return str(out), str(head)


@pytest.fixture(scope="session")
def eagle3_setups(tmp_path_factory, checkpoints):
    """arch -> (a 4-layer version of the fixture ``arch``, a random EAGLE-3 head reading its
    layers 0, 1 and 3 with a draft vocabulary of 256 tokens), built lazily, once."""
    from pathlib import Path

    from tests.fixtures.checkpoints import build_deeper, build_eagle3_head

    root = tmp_path_factory.mktemp("eagle3")
    cache: dict[str, tuple[str, str]] = {}

    class _Lazy(dict):
        def __getitem__(self, arch):
            if arch not in cache:
                target = build_deeper(Path(checkpoints[arch]), root / arch)
                head = build_eagle3_head(target, root / f"{arch}-head", [3, 0, 1], draft_vocab_size=256)
                cache[arch] = (str(target), str(head))
            return cache[arch]

    return _Lazy()
