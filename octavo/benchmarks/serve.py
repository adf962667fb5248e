"""``octavo bench serve``: load-test any OpenAI-compatible server over its public HTTP API.

Requests go to ``POST {base_url}/v1/completions`` with ``"stream": true``; arrivals follow a
Poisson process at ``--request-rate`` (``inf``: all at once), optionally capped at
``--max-concurrency`` requests in flight. For each request the client stamps every streamed
chunk that carries text:

- TTFT: first text chunk minus send time
- ITL: gaps between consecutive text chunks
- TPOT: (end-to-end - TTFT) / (output tokens - 1)
- E2EL: send time to the end of the stream

Output tokens come from the server's ``usage`` (``stream_options.include_usage``) and, where a
server sends none, from re-tokenizing the streamed text. Goodput counts requests per second
that meet every ``--slo`` (milliseconds). ``--sweep-rates 1,2,4,8,inf`` runs one benchmark per
rate and draws P50/P99 TTFT and ITL against offered load into a PNG.

``random`` prompts are sent as token-id arrays (the OpenAI completions API accepts them), so
their lengths are exact; ``--prompt-format text`` sends their decoded text instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from octavo.benchmarks import report as rep
from octavo.benchmarks.datasets import SampleRequest, get_requests

logger = logging.getLogger(__name__)

SLO_KEYS = ("ttft", "tpot", "e2el")
# What `octavo serve` with no model calls the shipped model (octavo.config).
DEFAULT_SERVED_NAME = "octavo-default"


@dataclass
class RequestResult:
    success: bool = False
    prompt_len: int = 0
    expected_output_len: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    usage_reported: bool = False
    error: str = ""


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000",
                        help="the server's root URL (requests go to BASE_URL/v1/completions)")
    parser.add_argument("--endpoint", default="/v1/completions")
    parser.add_argument("--model", default=None,
                        help="model name to send (default: the first id from GET /v1/models)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder or cached Hub id for building prompts and counting "
                             "tokens (default: the shipped model for 'octavo-default', else --model or "
                             "the served id as a local folder / cached Hub id, else the server's "
                             "/tokenize and /detokenize)")
    parser.add_argument("--dataset", default="random",
                        help="random, sharegpt (the shipped synthetic file) or a ShareGPT JSON path")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=None,
                        help="random: default 128; ShareGPT: default the reference completion's length")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--request-rate", default="inf",
                        help="mean requests per second of the Poisson arrivals, or inf (all at once)")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of inter-arrival times (1 = Poisson; <1 burstier)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="at most this many requests in flight")
    parser.add_argument("--sweep-rates", default=None,
                        help="comma-separated rates, e.g. 1,2,4,8,inf: one run per rate and a plot")
    parser.add_argument("--plot", default=None,
                        help="PNG path for --sweep-rates (default: next to --output-json, else "
                             "bench_serve_sweep.png)")
    parser.add_argument("--slo", default=None,
                        help="goodput SLOs in ms, e.g. ttft=500,tpot=50 (keys: ttft, tpot, e2el)")
    parser.add_argument("--prompt-format", default="auto", choices=["auto", "ids", "text"],
                        help="auto: token ids for random, text for ShareGPT")
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="send ignore_eos (vLLM extension) so outputs have exact lengths; "
                             "--no-ignore-eos for servers that reject unknown fields")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)
    rep.add_report_args(parser)


def parse_rate(value: str | float) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    v = value.strip().lower()
    if v in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(v)
    except ValueError:
        raise ValueError(f"--request-rate must be a positive number or inf; got {value!r}") from None
    if rate <= 0:
        raise ValueError(f"--request-rate must be > 0 or inf; got {value!r}")
    return rate


def parse_slo(value: str | None) -> dict[str, float]:
    """``ttft=500,tpot=50`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    if not value:
        return {}
    out = {}
    for part in value.split(","):
        key, sep, num = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"--slo takes KEY=MS pairs with keys {', '.join(SLO_KEYS)}; got {part!r}")
        try:
            ms = float(num)
        except ValueError:
            raise ValueError(f"--slo {key}: {num!r} is not a number of milliseconds") from None
        if ms <= 0:
            raise ValueError(f"--slo {key} must be > 0 ms; got {ms}")
        out[key] = ms
    return out


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


# -- HTTP -----------------------------------------------------------------------------------
def _sse_payloads(line: str) -> str | None:
    line = line.strip()
    if not line.startswith("data:"):
        return None
    return line[len("data:"):].strip()


async def send_request(client: Any, url: str, payload: dict[str, Any], req: SampleRequest,
                       tokenizer: Any = None) -> RequestResult:
    """One streaming completion; never raises (failures are results with ``success=False``)."""
    res = RequestResult(prompt_len=req.prompt_len, expected_output_len=req.expected_output_len)
    text_parts: list[str] = []
    start = last = time.perf_counter()
    got_first = False
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {body[:500]}"
                return res
            async for line in resp.aiter_lines():
                data = _sse_payloads(line)
                if data is None:
                    continue
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    res.error = json.dumps(chunk["error"])[:500]
                    return res
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    res.output_tokens = int(usage["completion_tokens"])
                    res.usage_reported = True
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") or ""
                    if not text:
                        continue
                    now = time.perf_counter()
                    if not got_first:
                        res.ttft_s = now - start
                        got_first = True
                    else:
                        res.itl_s.append(now - last)
                    last = now
                    text_parts.append(text)
        res.latency_s = time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - report, keep the benchmark running
        res.error = f"{type(e).__name__}: {e}"
        return res
    if not res.usage_reported:
        text = "".join(text_parts)
        res.output_tokens = len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer else len(text_parts)
    res.success = got_first
    if not got_first:
        res.error = "the stream carried no text"
    return res


async def get_served_model(base_url: str, timeout: float = 30.0) -> str:
    import httpx

    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            r = await client.get(url)
            r.raise_for_status()
            data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError) as e:
        raise ValueError(f"--base-url: cannot list models at {url} ({type(e).__name__}: {e}); "
                         "is the server up? (or pass --model)") from None
    if not data:
        raise ValueError(f"{url} lists no model; pass --model")
    return data[0]["id"]


def build_payload(args: argparse.Namespace, model: str, req: SampleRequest, tokenizer: Any,
                  max_tokens: int | None = None) -> dict[str, Any]:
    fmt = args.prompt_format
    if fmt == "auto":
        fmt = "ids" if req.is_token_ids else "text"
    if fmt == "ids":
        prompt: Any = req.prompt if req.is_token_ids else tokenizer.encode(req.prompt)
    else:
        prompt = tokenizer.decode(req.prompt) if req.is_token_ids else req.prompt
    payload: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens or req.expected_output_len,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.ignore_eos:
        payload["ignore_eos"] = True
    return payload


async def _arrivals(n: int, rate: float, burstiness: float, seed: int):
    """Yield 0..n-1, sleeping gamma(burstiness, 1/(rate*burstiness)) between them."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield i
        if math.isinf(rate) or i == n - 1:
            continue
        await asyncio.sleep(float(rng.gamma(burstiness, 1.0 / (rate * burstiness))))


async def run_load(args: argparse.Namespace, model: str, requests: list[SampleRequest],
                   tokenizer: Any, rate: float) -> tuple[list[RequestResult], float]:
    """Send every request at ``rate``; returns the results and the benchmark duration."""
    import httpx
    from tqdm.auto import tqdm

    url = args.base_url.rstrip("/") + args.endpoint
    limit = args.max_concurrency or len(requests)
    sem = asyncio.Semaphore(limit)
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    bar = tqdm(total=len(requests), desc=f"rate {rate_label(rate)} req/s",
               disable=args.disable_tqdm, dynamic_ncols=True)
    try:
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            # One request first, not counted: fails fast on a wrong URL/model, warms the server.
            probe_payload = build_payload(args, model, requests[0], tokenizer, max_tokens=2)
            probe = await send_request(client, url, probe_payload, requests[0], tokenizer)
            if not probe.success:
                raise ValueError(f"the test request to {url} failed: {probe.error}")

            async def one(req: SampleRequest) -> RequestResult:
                async with sem:
                    payload = build_payload(args, model, req, tokenizer)
                    r = await send_request(client, url, payload, req, tokenizer)
                bar.update(1)
                return r

            tasks = []
            t0 = time.perf_counter()
            async for i in _arrivals(len(requests), rate, args.burstiness, args.seed):
                tasks.append(asyncio.create_task(one(requests[i])))
            results = await asyncio.gather(*tasks)
            duration = time.perf_counter() - t0
    finally:
        bar.close()
    return list(results), duration


def compute_metrics(results: list[RequestResult], duration: float,
                    slo: dict[str, float] | None = None) -> dict[str, float]:
    ok = [r for r in results if r.success]
    ttft = [r.ttft_s for r in ok]
    e2el = [r.latency_s for r in ok]
    itl = [x for r in ok for x in r.itl_s]
    tpot = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    m: dict[str, float | int] = {
        "completed": len(ok),  # counts are ints: printed "8", not "8.00"
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": int(in_tokens),
        "total_output_tokens": int(out_tokens),
        "request_throughput_req_s": len(ok) / duration,
        "output_throughput_tok_s": out_tokens / duration,
        "total_token_throughput_tok_s": (in_tokens + out_tokens) / duration,
    }
    if slo:
        good = 0
        for r in ok:
            t = (r.latency_s - r.ttft_s) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
            vals = {"ttft": r.ttft_s * 1e3, "tpot": t * 1e3, "e2el": r.latency_s * 1e3}
            if all(vals[k] <= v for k, v in slo.items()):
                good += 1
        m["goodput_req_s"] = good / duration
        m["slo_attainment"] = good / len(results) if results else 0.0
    for name, vals in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2el_ms", e2el)):
        p = rep.percentiles(vals, name, 1e3)
        m.update({k: v for k, v in p.items() if not k.startswith(("min_", "max_"))})
    return m


def load_client_tokenizer(args: argparse.Namespace, model: str) -> Any:
    """The tokenizer prompts are built and counted with, first match wins:

    ``--tokenizer`` (a folder or cached Hub id; an error if it cannot load) → the served name
    ``octavo-default`` (the model shipped inside octavo) → ``--model`` / the served name as a
    local folder or cached Hub id → the server itself (``/tokenize`` + ``/detokenize``).
    """
    from octavo.engine.model_files import resolve_model_path

    if args.tokenizer:
        return _auto_tokenizer(resolve_model_path, args.tokenizer)
    if model == DEFAULT_SERVED_NAME:
        return _auto_tokenizer(resolve_model_path, None)
    try:
        return _auto_tokenizer(resolve_model_path, model)
    except ValueError as local_error:
        from octavo.benchmarks.remote_tokenizer import RemoteTokenizer

        try:
            tok = RemoteTokenizer(args.base_url, model)
        except Exception as e:  # noqa: BLE001  (httpx errors, a server without /tokenize)
            raise ValueError(
                f"{local_error}; and the server cannot tokenize either ({e}); pass --tokenizer "
                "with a local folder or a cached Hub id"
            ) from None
        logger.info("tokenizer: %s has no local copy; tokenizing through %s/tokenize", model, args.base_url)
        return tok


def _auto_tokenizer(resolve_model_path, name: str | None) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(resolve_model_path(name))
    except Exception as e:  # noqa: BLE001
        shown = name or "the shipped model"
        raise ValueError(f"--tokenizer: cannot load a tokenizer from {shown!r} ({e})") from None


def plot_sweep(points: list[dict[str, Any]], path: str | Path, title: str = "") -> str:
    """P50/P99 TTFT and ITL against offered load, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [p["label"] for p in points]
    xs = list(range(len(points)))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        for stat, style in (("median", "o-"), ("p99", "s--")):
            ys = [p["summary"].get(f"{stat}_{metric}", float("nan")) for p in points]
            ax.plot(xs, ys, style, label=f"{'P50' if stat == 'median' else 'P99'} {name}")
        ax.set_xticks(xs, labels)
        ax.set_xlabel("offered load (requests/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        ax.set_title(f"{name} vs offered load")
        for x, p in zip(xs, points, strict=True):
            ax.annotate(f"done {p['summary']['request_throughput_req_s']:.2g} req/s",
                        (x, p["summary"].get(f"median_{metric}", float("nan"))),
                        textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def print_sweep(points: list[dict[str, Any]]) -> None:
    cols = ["request_throughput_req_s", "output_throughput_tok_s", "median_ttft_ms", "p99_ttft_ms",
            "median_itl_ms", "p99_itl_ms", "median_tpot_ms", "p99_e2el_ms"]
    if any("goodput_req_s" in p["summary"] for p in points):
        cols.append("goodput_req_s")
    print()
    print("=== load-latency sweep ===")
    rep.print_table(["offered req/s", *cols],
                    [[p["label"], *(p["summary"].get(c, "-") for c in cols)] for p in points])


def run(args: argparse.Namespace) -> dict[str, Any]:
    slo = parse_slo(args.slo)
    rates = ([parse_rate(r) for r in args.sweep_rates.split(",") if r.strip()]
             if args.sweep_rates else [parse_rate(args.request_rate)])
    if not rates:
        raise ValueError("--sweep-rates needs at least one rate")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1; got {args.max_concurrency}")
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1; got {args.num_prompts}")

    model = args.model or asyncio.run(get_served_model(args.base_url))
    tokenizer = load_client_tokenizer(args, model)
    requests = get_requests(args.dataset, tokenizer, args.num_prompts, args.input_len,
                            args.output_len, seed=args.seed)

    points = []
    for rate in rates:
        results, duration = asyncio.run(run_load(args, model, requests, tokenizer, rate))
        failed = [r for r in results if not r.success]
        if failed:
            logger.warning("%d of %d requests failed; first error: %s", len(failed), len(results), failed[0].error)
        summary = compute_metrics(results, duration, slo)
        points.append({
            "label": rate_label(rate),
            "request_rate": rate_label(rate),
            "summary": summary,
            "requests": [{k: v for k, v in asdict(r).items() if k != "itl_s"} for r in results],
        })
        rep.print_summary(
            f"serve: {args.base_url} model {model}, rate {rate_label(rate)} req/s, "
            f"{args.num_prompts} prompts, max concurrency {args.max_concurrency or 'unlimited'}",
            {"serve": points[-1]},
        )

    if args.sweep_rates:
        print_sweep(points)
        results_obj: dict[str, Any] = {"sweep": points}
        plot = args.plot or (str(Path(args.output_json).with_suffix(".png")) if args.output_json
                             else "bench_serve_sweep.png")
        results_obj["plot"] = plot_sweep(points, plot, f"{model} @ {args.base_url}, {args.num_prompts} prompts")
        print(f"wrote {plot}")
    else:
        results_obj = {"serve": points[0]}
    env = rep.collect_environment({"server_base_url": args.base_url, "served_model": model,
                                   "slo_ms": slo})
    report = rep.make_report("serve", args, results_obj, env)
    return rep.finish(report, args)


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
