"""The sampler: distributions, exact logit transformations, logprobs, and metadata building."""

import math

import numpy as np
import pytest
import torch

from octavo.core.sampler import (
    Sampler,
    SamplingMetadata,
    apply_penalties,
    bad_words_positions,
    token_seed,
)
from octavo.core.scheduler_output import NewRequestData
from octavo.platforms.cpu import CpuPlatform
from octavo.sampling_params import SamplingParams
from octavo.worker.input_batch import InputBatch
from octavo.worker.transfer import DeviceTransfer

CPU_TRANSFER = DeviceTransfer(CpuPlatform, torch.device("cpu"))

LOGITS = torch.tensor([2.0, 1.55, 1.1, 0.62, 0.0, -0.45, -1.05, -3.0])
V = LOGITS.numel()
N = 20_000


def expected_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The analytic distribution, computed independently in float64 numpy."""
    x = logits.double().numpy() / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    keep = np.ones(len(x), dtype=bool)
    if min_p > 0:
        keep &= p >= min_p * p.max()
    order = np.argsort(-x, kind="stable")
    if top_k > 0:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        q = np.where(keep, p, 0.0)
        q /= q.sum()
        before = 0.0
        for t in order:
            if keep[t] and before >= top_p:
                keep[t] = False
            before += q[t]
    out = np.where(keep, p, 0.0)
    return out / out.sum()


def make_md(rows: list[dict], **kw) -> SamplingMetadata:
    """Metadata for rows given as dicts of temperature/top_k/top_p/min_p."""
    t = torch.tensor([r.get("temperature", 1.0) for r in rows])
    k = torch.tensor([r.get("top_k", 0) for r in rows])
    p = torch.tensor([r.get("top_p", 1.0) for r in rows])
    m = torch.tensor([r.get("min_p", 0.0) for r in rows])
    return SamplingMetadata(
        temperature=t,
        all_greedy=bool((t == 0).all()),
        all_random=bool((t > 0).all()),
        top_k=k if (k > 0).any() else None,
        top_p=p if (p < 1).any() else None,
        min_p=m if (m > 0).any() else None,
        **kw,
    )


CONFIGS = [
    dict(temperature=1.0),
    dict(temperature=0.5),
    dict(temperature=2.0, top_k=3),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=0.8, top_k=5, top_p=0.7),
    dict(temperature=1.3, min_p=0.1),
    dict(temperature=1.0, min_p=0.3, top_p=0.9),
]


def test_sample_distributions_match_analytic_in_one_mixed_batch():
    torch.manual_seed(0)
    rows = [c for c in CONFIGS for _ in range(N)]
    out = Sampler()(LOGITS.repeat(len(rows), 1), make_md(rows))
    samples = out.sampled_token_ids.view(len(CONFIGS), N)
    for i, cfg in enumerate(CONFIGS):
        expected = expected_probs(LOGITS, **cfg)
        counts = np.bincount(samples[i].numpy(), minlength=V)
        assert (counts[expected == 0] == 0).all(), f"{cfg}: sampled a masked token"
        tv = 0.5 * np.abs(counts / N - expected).sum()
        assert tv < 0.02, f"{cfg}: total variation {tv:.4f}"


def test_seeded_rows_match_the_distribution_and_do_not_depend_on_the_batch():
    cfg = dict(temperature=0.9, top_k=6)
    n = 4000
    gens = {i: torch.Generator().manual_seed(token_seed(1234, i)) for i in range(n)}
    out = Sampler()(LOGITS.repeat(n, 1), make_md([cfg] * n, generators=gens))
    counts = np.bincount(out.sampled_token_ids.numpy(), minlength=V)
    assert 0.5 * np.abs(counts / n - expected_probs(LOGITS, **cfg)).sum() < 0.04

    # The same seeds at other row positions, among unseeded rows, give the same tokens.
    first = out.sampled_token_ids[:50]
    rows = [dict(temperature=1.5)] * 7 + [cfg] * 50
    gens = {7 + i: torch.Generator().manual_seed(token_seed(1234, i)) for i in range(50)}
    again = Sampler()(LOGITS.repeat(len(rows), 1), make_md(rows, generators=gens))
    assert torch.equal(again.sampled_token_ids[7:], first)


def test_greedy_rows_take_the_argmax_and_mix_with_random_rows():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(3))
    rows = [dict(temperature=0.0), dict(temperature=1.0)] * 3
    out = Sampler()(logits, make_md(rows))
    greedy = logits.argmax(-1)
    assert torch.equal(out.sampled_token_ids[0::2], greedy[0::2])
    out = Sampler()(logits, make_md([dict(temperature=0.0)] * 6))
    assert torch.equal(out.sampled_token_ids, greedy)


def test_penalties_follow_the_vllm_formulas_exactly():
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.5, 1.0, 0.0]])
    pad = 6
    prompt = torch.tensor([[0, 1, pad]])
    output = torch.tensor([[2, 2, 3]])
    rep, freq, pres = 1.5, 0.3, 0.2
    got = apply_penalties(logits.clone(), prompt, output, torch.tensor([pres]), torch.tensor([freq]), torch.tensor([rep]))
    expected = torch.tensor([[
        2.0 / rep,                       # in the prompt, positive: divided
        -1.0 * rep,                      # in the prompt, negative: multiplied
        0.5 / rep - freq * 2 - pres,     # twice in the output
        -0.5 * rep - freq * 1 - pres,    # once in the output
        1.0,                             # never seen
        0.0,
    ]])
    torch.testing.assert_close(got, expected)
    # Neutral values leave a row alone.
    same = apply_penalties(logits.clone(), prompt, output, torch.zeros(1), torch.zeros(1), torch.ones(1))
    torch.testing.assert_close(same, logits)


def greedy_processed(logits: torch.Tensor, **md_kw) -> torch.Tensor:
    """The processed logits a greedy row samples from, recovered from its logprobs."""
    md = make_md([dict(temperature=0.0)] * logits.shape[0], max_num_logprobs=logits.shape[1], **md_kw)
    out = Sampler()(logits, md)
    lp = torch.full_like(logits, float("-inf"))
    lp.scatter_(1, out.logprobs.token_ids[:, 1:], out.logprobs.logprobs[:, 1:])
    return lp


def test_masks_and_logit_bias_change_logits_exactly():
    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 0.0, -1.0, 2.0, 0.5]])
    allowed = torch.ones(2, 5, dtype=torch.bool)
    allowed[0, [1, 3, 4]] = False  # row 0 may only produce 1, 3, 4
    allowed[1] = False
    bias = (torch.tensor([0, 1, 1]), torch.tensor([3, 0, 2]), torch.tensor([2.5, -1.0, 10.0]))
    bad = (torch.tensor([0]), torch.tensor([4]))
    min_tok = (torch.tensor([1]), torch.tensor([3]))
    lp = greedy_processed(
        logits.clone(), allowed_token_ids_mask=allowed, logit_bias=bias,
        bad_words_mask=bad, min_tokens_mask=min_tok,
    )
    inf = float("-inf")
    expected = torch.tensor([[inf, 0.2, inf, 0.4 + 2.5, inf], [1.0 - 1.0, 0.0, -1.0 + 10.0, inf, 0.5]])
    torch.testing.assert_close(lp, expected.log_softmax(-1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masking_every_allowed_token_never_samples_outside_the_allowed_set(temperature):
    """Row 0 may only produce 5 and 6, and bad words / min_tokens mask both: it still samples
    5 or 6 (before, greedy took token 0 and random sampling a NaN argmax). Row 1 is untouched."""
    logits = LOGITS.repeat(2, 1)
    allowed = torch.zeros(2, V, dtype=torch.bool)
    allowed[0] = True
    allowed[0, [5, 6]] = False
    md = make_md([{"temperature": temperature}] * 2, allowed_token_ids_mask=allowed,
                 bad_words_mask=(torch.tensor([0]), torch.tensor([5])),
                 min_tokens_mask=(torch.tensor([0, 1]), torch.tensor([6, 7])))
    for _ in range(20):
        out = Sampler()(logits.clone(), md).sampled_token_ids.tolist()
        assert out[0] in (5, 6)
        assert out[1] != 7 and (temperature > 0 or out[1] == 0)


def test_logprobs_are_log_softmax_of_the_processed_logits():
    torch.manual_seed(1)
    logits = torch.randn(4, 30) * 2
    rows = [
        dict(temperature=0.7, top_k=5),
        dict(temperature=1.3, top_p=0.6),
        dict(temperature=0.0),
        dict(temperature=1.0, min_p=0.05),
    ]
    md = make_md(rows, max_num_logprobs=3)
    md.presence_penalties = torch.tensor([0.5, 0.0, 0.0, 0.0])
    md.frequency_penalties = torch.zeros(4)
    md.repetition_penalties = torch.tensor([1.0, 1.2, 1.0, 1.0])
    md.prompt_token_ids = torch.tensor([[1, 2]] * 4)
    md.output_token_ids = torch.tensor([[3, 30]] * 4)
    out = Sampler()(logits.clone(), md)

    penalized = apply_penalties(
        logits.clone(), md.prompt_token_ids, md.output_token_ids, md.presence_penalties,
        md.frequency_penalties, md.repetition_penalties,
    )
    for i, cfg in enumerate(rows):
        x = penalized[i].double()
        if cfg["temperature"] > 0:
            # log_softmax of the temperature-scaled logits with the filtered tokens at -inf.
            p = torch.from_numpy(expected_probs(x.float(), **cfg))
            masked = torch.where(p > 0, x / cfg["temperature"], torch.tensor(float("-inf"), dtype=torch.float64))
            ref = masked.log_softmax(-1)
        else:
            ref = x.log_softmax(-1)
        ids = out.logprobs.token_ids[i]
        sampled = int(out.sampled_token_ids[i])
        assert int(ids[0]) == sampled
        torch.testing.assert_close(out.logprobs.logprobs[i].double(), ref[ids], atol=1e-5, rtol=1e-5)
        # Top-3 are the three most likely processed tokens; the sampled token's rank is exact.
        assert ids[1:].tolist() == ref.topk(3).indices.tolist()
        assert int(out.logprobs.sampled_ranks[i]) == int((ref >= ref[sampled]).sum())
        assert math.isfinite(float(ref[sampled]))


def test_bad_words_positions_use_the_generated_history():
    bad = {0: [[5], [7, 8, 9]], 1: [[7, 8, 9]], 2: [[3, 4]]}
    outs = {0: np.array([1, 2]), 1: np.array([6, 7, 8]), 2: np.array([], dtype=np.int64)}
    rows, toks = bad_words_positions(bad, outs)
    assert sorted(zip(rows, toks, strict=True)) == [(0, 5), (1, 9)]


# -- metadata built from the runner's persistent batch ----------------------------------
def add(batch, rid, prompt, outputs=(), eos=0, **params):
    batch.add_request(NewRequestData(rid, list(prompt), list(outputs), SamplingParams(**params), [[1]], 0, eos))
    row = batch.row_of[rid]
    return row


def test_metadata_from_input_batch_drives_the_pipeline():
    batch = InputBatch(max_num_reqs=4, max_model_len=32, block_size=4)
    v = 12
    r_min = add(batch, "min", [1, 2], [5], min_tokens=3, stop_token_ids=[9], temperature=0)
    r_ign = add(batch, "ign", [1, 2], [], min_tokens=2, ignore_eos=True, temperature=0)
    r_pen = add(batch, "pen", [3, 3], [4, 4, 6], temperature=0, frequency_penalty=0.5,
                repetition_penalty=2.0, logit_bias={7: 1.0}, allowed_token_ids=[0, 3, 4, 6, 7])
    sp = SamplingParams(temperature=0, bad_words=["x"])
    sp._bad_words_token_ids = [[8], [6, 2]]
    batch.add_request(NewRequestData("bad", [1], [6], sp, [[1]], 0, 0))
    r_bad = batch.row_of["bad"]
    rows = np.array([r_min, r_ign, r_pen, r_bad])
    md = batch.make_sampling_metadata(rows, v, CPU_TRANSFER)
    assert md.all_greedy and md.max_num_logprobs is None
    masked = set(zip(md.min_tokens_mask[0].tolist(), md.min_tokens_mask[1].tolist(), strict=True))
    assert masked == {(0, 0), (0, 9)}  # EOS and the stop token; nothing for ignore_eos's EOS
    assert set(zip(md.bad_words_mask[0].tolist(), md.bad_words_mask[1].tolist(), strict=True)) == {(3, 8), (3, 2)}
    assert md.allowed_token_ids_mask[2].nonzero().flatten().tolist() == [1, 2, 5, 8, 9, 10, 11]
    assert not md.allowed_token_ids_mask[[0, 1, 3]].any()

    logits = torch.zeros(4, v)
    logits[2] = torch.arange(v, dtype=torch.float32) / 10
    lp = greedy_processed(logits.clone(), **{k: getattr(md, k) for k in (
        "allowed_token_ids_mask", "bad_words_mask", "min_tokens_mask", "logit_bias",
        "presence_penalties", "frequency_penalties", "repetition_penalties",
        "prompt_token_ids", "output_token_ids")})
    x = torch.arange(v, dtype=torch.float32) / 10
    expected = torch.full((v,), float("-inf"))
    expected[0] = 0.0
    expected[3] = x[3] / 2.0                 # prompt token, repetition 2.0
    expected[4] = x[4] / 2.0 - 0.5 * 2       # output twice
    expected[6] = x[6] / 2.0 - 0.5 * 1       # output once
    expected[7] = x[7] + 1.0                 # bias
    torch.testing.assert_close(lp[2], expected.log_softmax(-1))
    assert lp[0, 0] == float("-inf") and lp[0, 9] == float("-inf") and lp[1, 0] > float("-inf")

    # After enough outputs min_tokens stops masking.
    batch.append_tokens(np.array([r_min]), np.array([5]))
    md = batch.make_sampling_metadata(np.array([r_min]), v, CPU_TRANSFER)
    assert md.min_tokens_mask is not None  # 2 outputs < 3
    batch.append_tokens(np.array([r_min]), np.array([5]))
    md = batch.make_sampling_metadata(np.array([r_min]), v, CPU_TRANSFER)
    assert md.min_tokens_mask is None


def test_seeded_generators_follow_the_output_index():
    batch = InputBatch(max_num_reqs=2, max_model_len=16, block_size=4)
    r = add(batch, "s", [1, 2, 3], [4, 5], seed=99, temperature=1.0, logprobs=2)
    add(batch, "g", [1], [], seed=5, temperature=0.0)
    md = batch.make_sampling_metadata(np.array([r, batch.row_of["g"]]), 8, CPU_TRANSFER)
    assert list(md.generators) == [0]  # greedy rows need no generator
    expected = torch.Generator().manual_seed(token_seed(99, 2))
    assert torch.equal(
        torch.empty(5).exponential_(generator=md.generators[0]),
        torch.empty(5).exponential_(generator=expected),
    )
    assert md.max_num_logprobs == 2


@pytest.mark.parametrize("top_k", [0, -1])
def test_top_k_zero_and_minus_one_disable(top_k):
    batch = InputBatch(max_num_reqs=1, max_model_len=8, block_size=4)
    r = add(batch, "a", [1], [], top_k=top_k, temperature=1.0)
    assert batch.make_sampling_metadata(np.array([r]), 8, CPU_TRANSFER).top_k is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_all_greedy_without_processing_takes_the_argmax_of_the_model_logits(dtype):
    """The all-greedy short cut (no mask, bias, penalty or logprobs) samples what the float32
    pipeline samples, ties and -inf/NaN rows included."""
    logits = torch.randn(8, 64, generator=torch.Generator().manual_seed(5)).to(dtype)
    logits[1, 10] = logits[1, 20] = logits[1].max() + 1  # a tie: the first maximum wins
    logits[2] = float("-inf")
    logits[3, 7] = float("nan")
    md = make_md([dict(temperature=0.0)] * 8)
    out = Sampler()(logits, md)
    assert out.sampled_token_ids.dtype == torch.int64 and out.logprobs is None
    assert torch.equal(out.sampled_token_ids, logits.float().argmax(-1))
    assert out.sampled_token_ids[1] == 10
    # the full pipeline (a no-op logit bias forces it) agrees
    md.logit_bias = (torch.tensor([0]), torch.tensor([0]), torch.tensor([0.0]))
    assert torch.equal(Sampler()(logits, md).sampled_token_ids, out.sampled_token_ids)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_first_max_index_is_argmax_with_ties_nan_and_inf(dtype):
    """The greedy / sampling pick equals ``argmax`` exactly: the first of tied maxima, a NaN
    taken as the maximum, an all -inf row's index 0."""
    from octavo.core.sampler import first_max_index

    g = torch.Generator().manual_seed(0)
    ties = torch.randint(-3, 4, (33, 4099), generator=g).to(dtype)  # many tied maxima per row
    nan = torch.randn(4, 4099, generator=g).to(dtype)
    nan[0, 100] = nan[0, 50] = nan[2, 4098] = float("nan")
    ninf = torch.full((3, 4099), float("-inf"), dtype=dtype)
    for x in (ties, nan, ninf, ties[:1, :7]):
        assert torch.equal(first_max_index(x), x.argmax(dim=-1))


def test_the_sampler_picks_with_its_first_max_kernel():
    """A ``first_max`` kernel given to the sampler makes every pick: the greedy short cut, the
    float32 greedy rows and the random draws (which stay seeded: same noise, same argmax)."""
    calls = []

    def spy(x):
        calls.append(x.dtype)
        return first_max_index(x)

    from octavo.core.sampler import first_max_index

    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    greedy = make_md([dict(temperature=0.0)] * 4)
    assert torch.equal(Sampler(first_max=spy)(logits, greedy).sampled_token_ids, logits.argmax(-1))
    mixed = [dict(temperature=0.0), dict(temperature=1.0)] * 2
    gens = {i: torch.Generator().manual_seed(i) for i in range(4)}
    out = Sampler(first_max=spy)(logits, make_md(mixed, generators=gens))
    again = Sampler()(logits, make_md(mixed, generators={i: torch.Generator().manual_seed(i) for i in range(4)}))
    assert torch.equal(out.sampled_token_ids, again.sampled_token_ids)
    assert calls == [logits.dtype, torch.float32, torch.float32]
