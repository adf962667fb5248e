"""Tensor parallelism on several GPUs: TP=2 vs TP=1, correctness and throughput.

    python3 benchmarks/bench_tp.py correctness --tp 2   # greedy tokens / logprobs, bf16
    python3 benchmarks/bench_tp.py throughput --tp 1    # 128 x (512 in / 256 out), 8B shape
    python3 benchmarks/bench_tp.py all --out tp.json    # both TP sizes, each in its own process

Correctness uses a real checkpoint (random HF init, saved once as bf16 safetensors) so both
TP sizes load the *same* weights; throughput uses the Llama-3.1-8B shape with dummy weights.
Each engine runs in its own process so GPU memory is clean. Prints ``RESULT {json}`` lines.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_cuda import SHAPES, random_prompts, write_model_dir  # noqa: E402

ROOT = Path("/tmp/octavo-tp")
MEDIUM = {  # ~1.2B Llama: big enough that TP has real work, quick to create and save
    **SHAPES["llama8b"], "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 32000,
}


def result(d: dict) -> None:
    print("RESULT " + json.dumps(d), flush=True)


def medium_checkpoint() -> Path:
    d = ROOT / "medium"
    if (d / "model.safetensors").exists() or (d / "model.safetensors.index.json").exists():
        return d
    import torch
    import transformers

    SHAPES["medium"] = MEDIUM
    write_model_dir("medium", ROOT)
    cfg = transformers.AutoConfig.from_pretrained(d)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    return d


def cmd_correctness(args) -> None:
    from octavo import LLM, SamplingParams

    d = medium_checkpoint()
    llm = LLM(str(d), dtype="bfloat16", tensor_parallel_size=args.tp, max_num_seqs=16)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(16, 128, MEDIUM["vocab_size"], seed=3)]
    sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, detokenize=False, logprobs=1)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outs]
    lps = [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True)] for o in outs]
    (ROOT / f"greedy_tp{args.tp}.json").write_text(json.dumps({"tokens": tokens, "logprobs": lps}))
    result({"what": "correctness", "tp": args.tp, "sequences": len(tokens)})
    llm.shutdown()


def cmd_throughput(args) -> None:
    from octavo import LLM, SamplingParams

    d = write_model_dir("llama8b", ROOT)
    t0 = time.perf_counter()
    llm = LLM(str(d), load_format="dummy", dtype="bfloat16", tensor_parallel_size=args.tp,
              max_num_seqs=128, max_num_batched_tokens=8192, max_model_len=4096)
    startup = time.perf_counter() - t0
    vocab = SHAPES["llama8b"]["vocab_size"]
    sp = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True, detokenize=False)
    warm = [{"prompt_token_ids": p} for p in random_prompts(8, 512, vocab, seed=1)]
    llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False), use_tqdm=False)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(128, 512, vocab, seed=2)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    result({"what": "throughput", "tp": args.tp, "output_tokens": n_out, "wall_s": wall,
            "output_tok_s": n_out / wall, "startup_s": startup})
    llm.shutdown()


def _sub(argv: list[str], timeout: float) -> list[dict]:
    try:
        p = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, timeout=timeout)
        text = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        text += "\nTIMEOUT"
    print(text[-4000:], flush=True)
    return [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]


def cmd_all(args) -> None:
    res: dict = {"runs": []}
    for tp in (1, 2):
        res["runs"] += _sub(["correctness", "--tp", str(tp)], 300)
    g1 = json.loads((ROOT / "greedy_tp1.json").read_text()) if (ROOT / "greedy_tp1.json").exists() else None
    g2 = json.loads((ROOT / "greedy_tp2.json").read_text()) if (ROOT / "greedy_tp2.json").exists() else None
    if g1 and g2:
        same = sum(a == b for a, b in zip(g1["tokens"], g2["tokens"], strict=True))
        # Logprob agreement over each sequence's common prefix (identical inputs so far).
        diffs, first_div = [], []
        for ta, tb, la, lb in zip(g1["tokens"], g2["tokens"], g1["logprobs"], g2["logprobs"], strict=True):
            k = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y), len(ta))
            first_div.append(k)
            diffs += [abs(x - y) for x, y in zip(la[: k + 1], lb[: k + 1], strict=False)]
        res["greedy_identical_sequences"] = f"{same}/{len(g1['tokens'])}"
        res["first_divergence_positions"] = first_div
        res["max_abs_logprob_diff_common_prefix"] = max(diffs)
        res["mean_abs_logprob_diff_common_prefix"] = sum(diffs) / len(diffs)
    for tp in (1, 2):
        res["runs"] += _sub(["throughput", "--tp", str(tp)], 300)
    thr = {r["tp"]: r["output_tok_s"] for r in res["runs"] if r.get("what") == "throughput"}
    if 1 in thr and 2 in thr:
        res["tp2_over_tp1_throughput"] = thr[2] / thr[1]
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["correctness", "throughput", "all"])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ROOT.mkdir(parents=True, exist_ok=True)
    {"correctness": cmd_correctness, "throughput": cmd_throughput, "all": cmd_all}[args.cmd](args)


if __name__ == "__main__":
    main()
