"""An OpenAI-compatible LM endpoint that answers from a run's recorded calls after a delay: an API
or a remote GPU server with the latency of one, and with exactly the replies the run got.

    python -m experiments.bench.replay_server experiments/results/2wiki-lm60 --delay 2 --port 8001

Clients reach it as they reach the embedded model served elsewhere (`--api-base
http://127.0.0.1:8001/v1`, no `--lm`), so a rerun of the recorded run sends it the same requests.
A request is matched on what the model sees (messages, temperature, max_tokens, stop); one the
record lacks gets a 404 with a one-line JSON error. `--slots N` answers at most N requests at once
(a server with N slots; 0: no limit). GET /stats counts what was served and what was missed.
`experiments/bench/scaling.py` measures Ray workers against it; the tests use it as the separate
process an LM endpoint is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sqlite3
import sys
import time
from pathlib import Path

from fastapi import FastAPI, Request  # at module level: FastAPI reads the handlers' annotations from here
from fastapi.responses import JSONResponse

from modules.errors import HyperProveError

MATCHED = ("messages", "temperature", "stop")  # with the token budget: what decides a reply


def request_match(request: dict) -> str:
    """The same text for the request DSPy records and the one it sends (which names the budget
    `max_completion_tokens`)."""
    budget = request.get("max_tokens", request.get("max_completion_tokens"))
    return json.dumps({"budget": budget, **{key: request.get(key) for key in MATCHED}}, sort_keys=True, ensure_ascii=False)


def recorded_usage(call: dict) -> dict:
    """The token counts the recorded reply came with (zeros when it has none)."""
    response = call.get("response") or {}
    usage = response.get("usage")
    if usage is None:  # DSPy's own record of a call: the server's completion is kept under provider_data
        usage = next((r.get("provider_data", {}).get("usage") for r in response.get("responses") or [] if isinstance(r, dict)), None)
    usage = usage if isinstance(usage, dict) else {}
    return {key: int(usage.get(key) or 0) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}


def matched(request: dict) -> dict:
    return json.loads(request_match(request))


class RecordedReplies:
    """request -> the reply the record holds for it, as an OpenAI chat completion."""

    def __init__(self, record):
        self.record = record
        self.keys = {request_match(call["request"]): key for key, call in record.calls.items()}

    def miss(self, body: dict) -> str:
        """Where a request the record lacks departs from the nearest recorded one."""
        from pipeline.lm.record import departure

        asked = matched(body)
        nearest, _ = self.record.nearest(asked, {"system": None, "question": None, "step": None})  # nobody asked: among all
        return f"no recorded reply for this request; the nearest recorded one {departure(matched(nearest['request']), asked)}" \
            if nearest else "the record is empty"

    def completion(self, body: dict) -> dict | None:
        key = self.keys.get(request_match(body))
        if key is None:
            return None
        return {"id": f"replay-{key[:16]}", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", ""),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": self.record.reply(key)}}],
                "usage": recorded_usage(self.record.calls[key])}


def is_lm_cache(path: Path) -> bool:
    from pipeline.lm.cache import STORE_FILE

    return path.name == STORE_FILE or (path / STORE_FILE).is_file()


def cached_calls(path: Path):
    """The calls an LM cache holds (`CACHE_DIR/lm-responses.sqlite3`), as a record: what an index
    build asked (its extraction calls are cached, not recorded)."""

    from pipeline.lm.cache import STORE_FILE, response_from_data
    from pipeline.lm.record import Record

    store = path if path.name == STORE_FILE else path / STORE_FILE
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT key, request, response FROM responses").fetchall()
    calls = {}
    for key, request, response in rows:
        reply = json.loads(response)
        if response_from_data(reply) is not None:
            calls[key] = {"key": key, "request": json.loads(request), "asked_by": [], **reply}
    return Record(store, calls)


def make_app(record, delay: float = 0.0, slots: int = 0):
    """The FastAPI app: POST /v1/chat/completions, GET /v1/models, /health, /stats."""
    replies = RecordedReplies(record)
    app = FastAPI(title="recorded LM calls")
    stats = {"served": 0, "missed": 0, "in_flight": 0, "most_in_flight": 0}
    gate = asyncio.Semaphore(slots) if slots else None

    async def answer(body: dict) -> JSONResponse:
        stats["in_flight"] += 1
        stats["most_in_flight"] = max(stats["most_in_flight"], stats["in_flight"])
        try:
            await asyncio.sleep(delay)
        finally:
            stats["in_flight"] -= 1
        completion = replies.completion(body)
        if completion is None:
            stats["missed"] += 1
            stats["last_missed"] = replies.miss(body)
            return JSONResponse({"error": {"message": stats["last_missed"], "type": "not_found"}}, status_code=404)
        stats["served"] += 1
        return JSONResponse(completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "the body is not JSON", "type": "invalid_request"}}, status_code=400)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return JSONResponse({"error": {"message": "expected a JSON object with messages", "type": "invalid_request"}}, status_code=400)
        if gate is None:
            return await answer(body)
        async with gate:
            return await answer(body)

    @app.get("/v1/models")
    async def models():
        names = sorted({str(call["request"].get("model", "")).removeprefix("openai/") for call in record.calls.values()})
        return {"object": "list", "data": [{"id": name, "object": "model"} for name in names]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "calls": len(record.calls)}

    @app.get("/stats")
    async def statistics():
        return dict(stats)

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", help="a results folder with lm_calls.jsonl.gz, or the file, or an LM cache dir (an index build's calls)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply (default 0)")
    parser.add_argument("--slots", type=int, default=0, help="requests answered at once (0: no limit)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="port (0: any free one)")
    args = parser.parse_args(argv)

    import uvicorn

    from pipeline.lm.record import read_record

    try:
        record = cached_calls(Path(args.record)) if is_lm_cache(Path(args.record)) else read_record(Path(args.record))
    except HyperProveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    listener = socket.socket()
    listener.bind((args.host, args.port))
    host, port = listener.getsockname()[:2]
    print(f"replaying {len(record.calls)} recorded calls of {args.record} at http://{host}:{port}/v1 "
          f"(delay {args.delay:g} s, {args.slots or 'unlimited'} slots)", flush=True)
    server = uvicorn.Server(uvicorn.Config(make_app(record, args.delay, args.slots), log_level="warning", timeout_keep_alive=30))
    server.run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
