"""The platform conformance kit: the tests a platform must pass before octavo runs on it.

A vendor (or octavo itself, for its built-ins) subclasses ``PlatformConformance`` in a pytest
module and names the platform; pytest then collects every check below::

    from octavo.testing.platform_conformance import PlatformConformance

    class TestMyChip(PlatformConformance):
        platform = "my_chip_octavo.platform.MyChipPlatform"   # or the class, or None

``platform = None`` tests whatever ``current_platform`` resolves to, so an installed plugin is
tested exactly as octavo would pick it. The checks:

- interface: API version compatible, identity and capability answers well-formed;
- device: a round trip of every supported dtype, the device operations, sane memory queries,
  deterministic seeding;
- attention: the platform's chosen backend against ``torch_ref`` (float32, on the host) over
  three steps of a random paged batch — prefills, prefill chunks after cached context, and
  decodes mixed in one batch, with shuffled block tables — for MHA and GQA heads, every
  supported dtype and two block sizes;
- end to end: the engine config the platform produces, and a tiny model's greedy tokens through
  the whole engine against the CPU platform's reference run.

Override the class attributes to adapt tolerances or shapes, and the ``conformance_model_dir``
fixture to use your own checkpoint (the default is ``OCTAVO_DEFAULT_MODEL`` / the shipped model,
else a tiny random Llama the kit writes itself; nothing is downloaded).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from octavo.attention.backend import CommonAttentionMetadata
from octavo.attention.backends.torch_ref import TorchRefBackend, TorchRefImpl
from octavo.platforms import get_current_platform, load_platform_class, use_platform
from octavo.platforms.interface import Platform, check_api_version

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Request plans for the paged-attention check: tokens scheduled per step (0 = absent that step).
# Step 1 prefills three requests, step 2 mixes a decode, a chunk after cached context and a new
# prompt, step 3 decodes everything. Lengths cross block boundaries for small block sizes.
_MODEL_CACHE: dict[str, str] = {}

ATTENTION_PLAN: tuple[tuple[int, ...], ...] = ((13, 1, 1), (5, 9, 1), (0, 20, 1), (33, 0, 1))


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random Llama checkpoint with a trained byte-level BPE tokenizer.

    Deterministic for a seed; weights use a wide init so greedy decisions are never near-ties.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words = "the a paged attention kernel block cache token model engine request batch of to on".split()
    corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(500)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        pad_token="<|endoftext|>", clean_up_tokenization_spaces=False,
    )
    cfg = LlamaConfig(
        vocab_size=len(hf_tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
        bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id, rms_norm_eps=1e-6, initializer_range=0.2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    return out


def _build_metadata(
    steps_lens: list[int], computed: list[int], tables: list[list[int]], block_size: int,
    device: torch.device,
) -> tuple[CommonAttentionMetadata, list[int]]:
    """Metadata for one step; returns it and the indices of the requests present."""
    present = [i for i, n in enumerate(steps_lens) if n > 0]
    n = np.array([steps_lens[i] for i in present], dtype=np.int64)
    qsl = np.zeros(len(present) + 1, dtype=np.int64)
    qsl[1:] = np.cumsum(n)
    seq_lens = np.array([computed[i] + steps_lens[i] for i in present], dtype=np.int64)
    max_blocks = int(-(-seq_lens.max() // block_size))
    table = np.zeros((len(present), max_blocks), dtype=np.int32)
    slots = []
    for row, i in enumerate(present):
        blocks = tables[i][: -(-int(seq_lens[row]) // block_size)]
        table[row, : len(blocks)] = blocks
        for pos in range(computed[i], computed[i] + steps_lens[i]):
            slots.append(tables[i][pos // block_size] * block_size + pos % block_size)
    md = CommonAttentionMetadata(
        query_start_loc=torch.from_numpy(qsl.astype(np.int32)).to(device),
        seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(device),
        block_table=torch.from_numpy(table).to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
        num_reqs=len(present),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=int(n.max()),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
    )
    return md, present


class PlatformConformance:
    """Subclass as ``Test<Something>`` and set ``platform``; pytest collects the checks."""

    platform: ClassVar[type[Platform] | str | None] = None
    # (num_heads, num_kv_heads, head_size): multi-head and grouped-query attention.
    attention_head_configs: ClassVar[tuple[tuple[int, int, int], ...]] = ((4, 4, 64), (8, 2, 128))
    # None: the platform's default block size and another supported one (the smallest >= 8,
    # or the next larger when that is the default).
    attention_block_sizes: ClassVar[tuple[int, ...] | None] = None
    # (atol, rtol) of the backend against float32 torch_ref on the same rounded inputs.
    attention_tolerance: ClassVar[dict[str, tuple[float, float]]] = {
        "float32": (2e-3, 2e-3),  # room for TF32 matmuls in GPU kernels
        "bfloat16": (3e-2, 3e-2),
        "float16": (5e-3, 5e-3),
    }
    greedy_prompts: ClassVar[tuple[str, ...]] = (
        "the paged attention kernel",
        "a block of the cache",
        "request batch to model engine on token",
    )
    greedy_max_tokens: ClassVar[int] = 16
    # Without float32 support, only this many leading greedy tokens must match the reference.
    greedy_half_precision_tokens: ClassVar[int] = 4

    # -- fixtures --------------------------------------------------------------------------
    @pytest.fixture
    def plat(self) -> type[Platform]:
        """The platform under test (``platform`` attribute, or the resolved one)."""
        p = self.platform
        if p is None:
            return get_current_platform()
        if isinstance(p, str):
            cls = load_platform_class(p)
            check_api_version(cls, f"{type(self).__name__}.platform")
            return cls
        return p

    @pytest.fixture
    def conformance_model_dir(self, tmp_path_factory: pytest.TempPathFactory) -> str:
        """A small HF checkpoint folder: the default model if present, else a tiny random one
        (written once per process)."""
        from octavo.engine.model_files import resolve_model_path

        try:
            return resolve_model_path(None)
        except ValueError:
            pass
        if "tiny" not in _MODEL_CACHE:
            _MODEL_CACHE["tiny"] = str(build_tiny_checkpoint(tmp_path_factory.mktemp("conformance_model")))
        return _MODEL_CACHE["tiny"]

    # -- interface -------------------------------------------------------------------------
    def test_api_version_compatible(self, plat: type[Platform]) -> None:
        check_api_version(plat, "the platform under test")

    def test_is_available(self, plat: type[Platform]) -> None:
        assert plat.unavailable_reason() is None, plat.unavailable_reason()
        assert plat.is_available() is True

    def test_identity_and_capabilities(self, plat: type[Platform]) -> None:
        assert isinstance(plat.name, str) and plat.name and plat.name != "abstract"
        torch.device(plat.device_type)  # a device type torch knows
        dtypes = plat.supported_dtypes()
        assert dtypes and all(isinstance(d, torch.dtype) for d in dtypes)
        for ckpt in (None, torch.float32, torch.bfloat16, torch.float16):
            assert plat.resolve_auto_dtype(ckpt) in dtypes
        assert plat.default_block_size in plat.supported_block_sizes
        assert all(b > 0 and b & (b - 1) == 0 for b in plat.supported_block_sizes)
        assert "auto" in plat.supported_kv_cache_dtypes
        assert plat.attn_backend_candidates(), "no attention backend in the priority list"
        for choice in (plat.get_graph_capture(), plat.get_communicator()):
            assert isinstance(choice.value, str) and choice.value and choice.reason
        assert isinstance(plat.get_dist_backend(), str) and plat.get_dist_backend()
        facts = plat.describe()
        assert isinstance(facts, dict) and all(isinstance(k, str) for k in facts)

    # -- device ----------------------------------------------------------------------------
    def test_device_round_trip(self, plat: type[Platform]) -> None:
        dev = plat.device()
        for dtype in plat.supported_dtypes():
            x = torch.arange(64, dtype=torch.float32).reshape(8, 8).to(dtype)
            y = x.to(dev)
            assert y.device.type == torch.device(plat.device_type).type
            z = (y * 2 + 1).to("cpu")
            assert torch.equal(z, x * 2 + 1), f"round trip of {dtype} changed values"
        if plat.is_pin_memory_available():
            pinned = torch.arange(16, dtype=torch.float32).pin_memory()
            on_dev = pinned.to(dev, non_blocking=True)
            plat.synchronize()
            assert torch.equal(on_dev.cpu(), pinned)

    def test_device_operations(self, plat: type[Platform]) -> None:
        assert plat.device_count() >= 1
        name = plat.get_device_name()
        assert isinstance(name, str) and name
        cap = plat.get_device_capability()
        assert cap is None or (len(cap) == 2 and all(isinstance(c, int) for c in cap))
        plat.set_device(plat.device())
        plat.synchronize()
        plat.empty_cache()
        assert isinstance(plat.is_pin_memory_available(), bool)
        with plat.inference_mode():
            t = torch.ones(2, device=plat.device())
            assert t.is_inference()
        with plat.stream_context():
            assert (torch.ones(2, device=plat.device()) + 1).sum().item() == 4

    def test_memory_queries_sane(self, plat: type[Platform]) -> None:
        free, total = plat.mem_get_info()
        assert isinstance(free, int) and isinstance(total, int)
        assert total > 0 and 0 <= free <= total, (free, total)
        dev_total = plat.get_device_total_memory()
        assert dev_total > 0
        assert abs(dev_total - total) <= 0.05 * max(dev_total, total), (dev_total, total)

    def test_seeding_deterministic(self, plat: type[Platform]) -> None:
        dev = plat.device()

        def draw() -> tuple[Any, ...]:
            return (
                random.random(),
                float(np.random.rand()),
                torch.rand(4).tolist(),
                torch.randn(16, device=dev).cpu().tolist(),
            )

        plat.seed_everything(1234)
        a = draw()
        plat.seed_everything(1234)
        b = draw()
        plat.seed_everything(4321)
        c = draw()
        assert a == b, "the same seed must give the same draws"
        assert a[3] != c[3], "different seeds must give different device draws"

    # -- attention -------------------------------------------------------------------------
    def _block_sizes(self, plat: type[Platform]) -> list[int]:
        if self.attention_block_sizes is not None:
            return list(self.attention_block_sizes)
        default = plat.default_block_size
        others = [b for b in sorted(plat.supported_block_sizes) if b >= 8 and b != default]
        smaller = [b for b in others if b < default]
        other = smaller[0] if smaller else (others[0] if others else default)
        return sorted({default, other})

    @pytest.mark.parametrize("dtype_name", list(_DTYPES))
    @pytest.mark.parametrize("heads", [0, 1], ids=["mha", "gqa"])
    def test_attention_matches_torch_ref(
        self, plat: type[Platform], dtype_name: str, heads: int
    ) -> None:
        dtype = _DTYPES[dtype_name]
        if dtype not in plat.supported_dtypes():
            pytest.skip(f"{plat.name} does not support {dtype_name}")
        if heads >= len(self.attention_head_configs):
            pytest.skip("no such head configuration")
        num_heads, num_kv_heads, head_size = self.attention_head_configs[heads]
        atol, rtol = self.attention_tolerance[dtype_name]
        for block_size in self._block_sizes(plat):
            backend, _ = plat.get_attn_backend(head_size, dtype, "auto", block_size)
            self._check_attention(plat, backend, dtype, num_heads, num_kv_heads, head_size, block_size, atol, rtol)

    def _check_attention(
        self, plat: type[Platform], backend: Any, dtype: torch.dtype, num_heads: int,
        num_kv_heads: int, head_size: int, block_size: int, atol: float, rtol: float,
    ) -> None:
        dev = plat.device()
        gen = torch.Generator().manual_seed(block_size * 1000 + head_size + num_kv_heads)
        totals = [sum(plan) for plan in ATTENTION_PLAN]
        need = [-(-t // block_size) for t in totals]
        num_blocks = sum(need) + 3  # + the null block 0 and spares
        ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        tables, at = [], 0
        for k in need:
            tables.append(ids[at : at + k])
            at += k
        scale = head_size**-0.5
        impl = backend.get_impl_cls()(num_heads, head_size, scale, num_kv_heads)
        ref_impl = TorchRefImpl(num_heads, head_size, scale, num_kv_heads)
        cache = torch.zeros(
            backend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size),
            dtype=dtype, device=dev,
        )
        ref_cache = torch.zeros(
            TorchRefBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size),
            dtype=torch.float32,
        )
        computed = [0] * len(ATTENTION_PLAN)
        for step in range(len(ATTENTION_PLAN[0])):
            lens = [plan[step] for plan in ATTENTION_PLAN]
            md_dev, present = _build_metadata(lens, computed, tables, block_size, dev)
            md_cpu, _ = _build_metadata(lens, computed, tables, block_size, torch.device("cpu"))
            t = md_cpu.num_actual_tokens
            q = torch.randn(t, num_heads, head_size, generator=gen).to(dtype)
            k = torch.randn(t, num_kv_heads, head_size, generator=gen).to(dtype)
            v = torch.randn(t, num_kv_heads, head_size, generator=gen).to(dtype)
            with plat.inference_mode():
                out = impl.forward(
                    q.to(dev), k.to(dev), v.to(dev), cache, backend.build_metadata(md_dev)
                )
                plat.synchronize()
            ref = ref_impl.forward(q.float(), k.float(), v.float(), ref_cache, md_cpu)
            assert out.shape == (t, num_heads, head_size), out.shape
            torch.testing.assert_close(
                out.float().cpu(), ref, atol=atol, rtol=rtol,
                msg=lambda m, s=step, lens=lens: (
                    f"{backend.name} on {plat.name} differs from torch_ref at step {s + 1} "
                    f"(tokens per request {lens}, block size {block_size}, {dtype}): {m}"
                ),
            )
            for i in present:
                computed[i] += lens[i]

    def test_forced_unknown_backend_is_a_clear_error(self, plat: type[Platform]) -> None:
        dtype = plat.supported_dtypes()[0]
        with pytest.raises(ValueError, match="no_such_backend"):
            plat.get_attn_backend(64, dtype, "auto", plat.default_block_size, forced="no_such_backend")

    # -- end to end ------------------------------------------------------------------------
    def test_engine_config(self, plat: type[Platform], conformance_model_dir: str) -> None:
        from octavo.engine.arg_utils import EngineArgs

        with use_platform(plat):
            cfg = EngineArgs(model=conformance_model_dir, max_model_len=256).create_engine_config()
            assert cfg.cache_config.block_size in plat.supported_block_sizes
            assert cfg.model_config.dtype in plat.supported_dtypes()
            assert cfg.device_config.device == plat.device_type
            unsupported = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b not in plat.supported_block_sizes]
            if unsupported:
                with pytest.raises(ValueError, match="block.size"):
                    EngineArgs(model=conformance_model_dir, block_size=unsupported[0]).create_engine_config()

    def _greedy(self, platform: type[Platform], model_dir: str, dtype: str) -> list[list[int]]:
        from octavo.entrypoints.llm import LLM
        from octavo.sampling_params import SamplingParams

        with use_platform(platform):
            llm = LLM(
                model_dir, dtype=dtype, max_model_len=256, max_num_seqs=4,
                num_gpu_blocks_override=128, seed=0,
            )
            params = SamplingParams(max_tokens=self.greedy_max_tokens, temperature=0.0, ignore_eos=True)
            outs = llm.generate(list(self.greedy_prompts), params, use_tqdm=False)
            tokens = [list(o.outputs[0].token_ids) for o in outs]
            del llm
            platform.empty_cache()
        return tokens

    def test_greedy_matches_cpu_reference(
        self, plat: type[Platform], conformance_model_dir: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from octavo.platforms.cpu import CpuPlatform

        with monkeypatch.context() as m:
            m.setenv("OCTAVO_ATTENTION_BACKEND", "torch_ref")  # the reference is the reference
            expected = self._greedy(CpuPlatform, conformance_model_dir, "float32")
        exact = torch.float32 in plat.supported_dtypes()
        dtype = "float32" if exact else str(plat.supported_dtypes()[0]).removeprefix("torch.")
        got = self._greedy(plat, conformance_model_dir, dtype)
        for prompt, e, g in zip(self.greedy_prompts, expected, got, strict=True):
            assert len(g) == self.greedy_max_tokens, (prompt, g)
            n = len(e) if exact else self.greedy_half_precision_tokens
            assert g[:n] == e[:n], f"greedy tokens of {prompt!r} on {plat.name} ({dtype}): {g} != CPU {e}"

