"""Every quantized checkpoint layout loads and runs, teacher-forced against transformers.

Weight-only formats: the reference is transformers on a plain float32 checkpoint holding the
dequantized weights; octavo in float32 must agree on the top-1 token at >= 99% of positions.
Activation-quantized formats (W8A8): the reference is transformers running the quantized
checkpoint itself through the ``compressed-tensors`` package (it rounds activations as the
format prescribes); >= 97%. The measured numbers are printed (``-s``) for the record.
"""

from __future__ import annotations

import pytest

from octavo import LLM
from tests.hf_reference import hf_model
from tests.quantization import writers
from tests.quantization.agreement import compare, reference_sequences

WEIGHT_ONLY = {
    "ct-w4a16-g32-sym": lambda s, d: writers.ct_weight_only(s, d, 4, 32, sym=True),
    "ct-w4a16-g64-asym": lambda s, d: writers.ct_weight_only(s, d, 4, 64, sym=False),
    "ct-w4a16-g128-asym": lambda s, d: writers.ct_weight_only(s, d, 4, 128, sym=False),
    "ct-w4a16-g128-sym": lambda s, d: writers.ct_weight_only(s, d, 4, 128, sym=True),
    "ct-w8a16-channel-sym": lambda s, d: writers.ct_weight_only(s, d, 8, None, sym=True),
    "ct-w8a16-g64-asym": lambda s, d: writers.ct_weight_only(s, d, 8, 64, sym=False),
    "ct-w4a16-g32-actorder-group": lambda s, d: writers.ct_weight_only(s, d, 4, 32, sym=False, actorder=True),
    "ct-w8a16-int-quantized": lambda s, d: writers.ct_weight_only(s, d, 8, None, sym=True, packed=False),
    "awq-g64": lambda s, d: writers.awq(s, d, 64),
    "awq-g128": lambda s, d: writers.awq(s, d, 128),
    "gptq-g128": lambda s, d: writers.gptq(s, d, 128, desc_act=False),
    "gptq-g32-desc-act": lambda s, d: writers.gptq(s, d, 32, desc_act=True),
    "gptq-g64-desc-act-asym": lambda s, d: writers.gptq(s, d, 64, desc_act=True, sym=False),
}


def _vocab(path: str) -> int:
    return hf_model(path).config.vocab_size


@pytest.mark.parametrize("fmt", list(WEIGHT_ONLY))
def test_weight_only_format_matches_dequantized_reference(fmt, wide_llama, tmp_path):
    qdir, deq = WEIGHT_ONLY[fmt](wide_llama, tmp_path / "q")
    ref_dir = writers.write_dequantized(wide_llama, tmp_path / "deq", deq)
    ref = hf_model(str(ref_dir))
    seqs = reference_sequences(ref, _vocab(wide_llama))
    llm = LLM(str(qdir), dtype="float32", max_num_seqs=8)
    result = compare(llm, ref, seqs)
    print(f"\n{fmt}: {result}")
    assert result.top1 >= 0.99, result
    assert result.mean_abs_dlogprob < 1e-3, result


def test_ct_pack_quantized_layout_is_what_compressed_tensors_writes():
    """Our test packer agrees with the compressed-tensors package's own (when installed)."""
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    import torch

    gen = torch.Generator().manual_seed(0)
    for bits in (4, 8):
        codes = torch.randint(0, 1 << bits, (24, 64), generator=gen, dtype=torch.int64).to(torch.uint8)
        signed = (codes.to(torch.int16) - (1 << (bits - 1))).to(torch.int8)
        for dim in (0, 1):
            assert torch.equal(writers.pack(codes, bits, dim), helpers.pack_to_int32(signed, bits, packed_dim=dim))
