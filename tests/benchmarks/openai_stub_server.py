"""A minimal OpenAI-compatible streaming server over a real ``LLMEngine`` (not octavo serve).

``bench serve`` must work against any server speaking the OpenAI completions API; this one is
deliberately independent of ``octavo/entrypoints/openai`` so the test proves exactly that. It
implements ``GET /v1/models`` and ``POST /v1/completions`` (text or token-id prompts,
``stream`` with ``stream_options.include_usage``, ``max_tokens``, ``temperature``,
``ignore_eos``). One background thread drives ``engine.step()``; each request reads its
deltas from an asyncio queue.

Run: ``python -m tests.benchmarks.openai_stub_server --model DIR --port 8123``
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import threading
import time


def make_app(model: str, max_model_len: int = 512):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.llm_engine import LLMEngine
    from octavo.engine.output_processor import OutputKind
    from octavo.sampling_params import SamplingParams

    engine = LLMEngine.from_engine_args(EngineArgs(model=model, max_model_len=max_model_len))
    lock = threading.Lock()
    wake = threading.Event()
    queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
    ids = itertools.count()

    def step_loop() -> None:
        while True:
            with lock:
                busy = engine.has_unfinished_requests()
                outs = engine.step() if busy else []
            if not busy:
                wake.wait(0.05)
                wake.clear()
                continue
            for o in outs:
                loop, q = queues[o.request_id]
                loop.call_soon_threadsafe(q.put_nowait, o)

    threading.Thread(target=step_loop, daemon=True).start()
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "stub"}]}

    @app.post("/v1/completions")
    async def completions(body: dict):
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            prompt = {"prompt_token_ids": prompt}
        try:
            params = SamplingParams(
                max_tokens=body.get("max_tokens", 16),
                temperature=body.get("temperature", 1.0),
                ignore_eos=bool(body.get("ignore_eos", False)),
            )
            rid = f"cmpl-{next(ids)}"
            q: asyncio.Queue = asyncio.Queue()
            queues[rid] = (asyncio.get_running_loop(), q)
            with lock:
                engine.add_request(rid, prompt, params, output_kind=OutputKind.DELTA)
        except ValueError as e:
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error"}}, 400)
        wake.set()
        created = int(time.time())

        def event(obj: dict) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        async def stream():
            n_prompt = n_out = 0
            try:
                while True:
                    o = await q.get()
                    c = o.outputs[0]
                    n_prompt = len(o.prompt_token_ids)
                    n_out += len(c.token_ids)
                    yield event({"id": rid, "object": "text_completion", "created": created,
                                 "model": model, "choices": [{"index": 0, "text": c.text,
                                                              "finish_reason": c.finish_reason}]})
                    if o.finished:
                        break
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield event({"id": rid, "object": "text_completion", "created": created,
                                 "model": model, "choices": [],
                                 "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                           "total_tokens": n_prompt + n_out}})
                yield "data: [DONE]\n\n"
            finally:
                queues.pop(rid, None)

        if not body.get("stream"):
            return JSONResponse({"error": {"message": "this stub only streams"}}, 400)
        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()
    uvicorn.run(make_app(args.model), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
