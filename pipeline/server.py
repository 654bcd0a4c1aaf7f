"""`hyperprove serve IDX`: answers with their evidence over HTTP, and a page that shows each hop as
it is answered.

    POST /ask {"question": "..."}     the answer record of `ask --json`: the chain, the top passages' text and files
    GET  /ask/stream?question=...     the same as server-sent events: queued, plan, hop (each), answer | failure
    GET  /                            the page: a question box; plan, hops and chain appear as they stream
    GET  /health                      the index, the LM, questions answering and waiting

Questions wait their turn in arrival order for one of `lm.concurrency` places (1 with the local
model, whose one server slot would only interleave two questions' calls; 8 with an API model),
and run in threads beside the event loop. A question the program cannot answer well still
returns its fallbacks as any answer does; an LM that is gone is a 503 and bad input a 4xx, each
with a one-line JSON error, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from modules.errors import HyperProveError

MAX_QUESTION = 2000  # characters: a question, not a document
log = logging.getLogger("hyperprove.serve")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def question_problem(value) -> tuple[int, str] | None:
    """What is wrong with a request's question (a status and one line), or None."""
    if not isinstance(value, str):
        return 422, f'"question" must be a string, found {type(value).__name__}'
    if not value.strip():
        return 422, '"question" is empty'
    if len(value) > MAX_QUESTION:
        return 413, f'"question" is {len(value)} characters long; at most {MAX_QUESTION}'
    return None


def failure(exception: BaseException) -> tuple[int, str]:
    """The status and one line for a question that could not be answered at all."""
    from pipeline.lm import LM_UNAVAILABLE

    if isinstance(exception, LM_UNAVAILABLE):
        return 503, f"the LM could not be reached: {type(exception).__name__}: {str(exception).splitlines()[0] if str(exception) else ''}".rstrip(": ")
    if isinstance(exception, HyperProveError):
        return 400, str(exception)
    log.exception("a question failed")
    return 500, f"the question could not be answered: {type(exception).__name__}"


class Turns:
    """Places to answer a question, taken in arrival order (asyncio's semaphore is first come,
    first served), each question in a thread of its own; a place is given back when the
    question's thread ends, even if its client has gone."""

    def __init__(self, places: int):
        from concurrent.futures import ThreadPoolExecutor

        self.places, self.free = places, asyncio.Semaphore(places)
        self.threads = ThreadPoolExecutor(max_workers=places, thread_name_prefix="question")
        self.waiting = self.answering = 0

    async def run(self, work: Callable[[], dict], queued: Callable[[int], None] = lambda ahead: None) -> asyncio.Future:
        """`work` in a thread once a place is free (`queued(ahead)` first, when none is)."""
        if self.answering >= self.places:
            queued(self.waiting)
        self.waiting += 1
        try:
            await self.free.acquire()
        finally:
            self.waiting -= 1
        self.answering += 1
        done = asyncio.get_running_loop().run_in_executor(self.threads, work)

        def give_back(_):
            self.answering -= 1
            self.free.release()

        done.add_done_callback(give_back)
        return done


def make_app(asker, places: int, title: str = "HyperProve"):
    """The FastAPI app over an `Asker` (an index and a program, loaded once)."""
    from pipeline.pages import chain_parts, chain_view, live_page

    app = FastAPI(title=title)
    turns = Turns(places)

    def answered(question: str, listener=None) -> dict:
        return asker(question, listener)[0]

    @app.post("/ask")
    async def ask(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the body is not JSON")
        if not isinstance(body, dict) or "question" not in body:
            return error(422, 'expected a JSON object with "question"')
        if problem := question_problem(question := body["question"]):
            return error(*problem)
        question = question.strip()
        try:
            return await (await turns.run(lambda: answered(question)))
        except Exception as exception:  # noqa: BLE001 - every failure is one line, never a traceback
            return error(*failure(exception))

    @app.get("/ask/stream")
    async def stream(question: str = ""):
        if problem := question_problem(question):
            return error(*problem)
        question = question.strip()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        chain: list[dict] = []
        parts = chain_parts()

        def heard(event: str, data: dict) -> None:  # in the question's thread
            if event == "hop":
                chain.append(data)
                view = chain_view({"question": question, "chain": list(chain)}, asker.titles, sources=asker.passage_sources)
                data = {"hop": data, "html": str(parts.hop_section(view["hops"][-1]))}
            else:
                data = {**data, "html": str(parts.plan(data["sub_questions"]))}
            loop.call_soon_threadsafe(events.put_nowait, (event, data))

        async def sent():
            waiting = await turns.run(lambda: answered(question, heard), queued=lambda ahead: events.put_nowait(("queued", {"ahead": ahead})))
            waiting.add_done_callback(lambda _: events.put_nowait(("done", None)))
            while True:
                event, data = await events.get()
                if event != "done":
                    yield message(event, data)
                    continue
                try:
                    record = waiting.result()
                except Exception as exception:  # noqa: BLE001 - the page shows one line
                    status, line = failure(exception)
                    yield message("failure", {"status": status, "error": line})
                else:
                    page = chain_view(record, asker.titles, sources=asker.passage_sources)
                    yield message("answer", {"record": record, "html": str(parts.chain_body(page))})
                return

        return StreamingResponse(sent(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    @app.get("/", response_class=HTMLResponse)
    async def page():
        counts = asker.index.counts()
        return live_page(title, f"{counts['passages']} passages, {counts['facts']} facts; the LM: {asker.runtime.session.id}")

    @app.get("/health")
    async def health():
        return {"status": "ok", "passages": len(asker.index.passages), "lm": asker.runtime.session.id,
                "answering": turns.answering, "waiting": turns.waiting, "places": places}

    return app


def message(event: str, data: dict) -> str:
    """One server-sent event (JSON on one line)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def serve(config, index_directory: str, host: str = "127.0.0.1", port: int = 8000, allow_remote: bool = False, runtime=None,
          log: Callable[[str], None] = print, stop: threading.Event | None = None) -> dict:
    """`hyperprove serve`: load the index and the program once, then serve until Ctrl-C, SIGTERM or
    SIGHUP (or `stop`)."""
    import uvicorn

    from pipeline.program import Asker
    from pipeline.serving import check_host, wait_until_stopped

    check_host(host, allow_remote, "questions over this index")
    asker = Asker(config, index_directory, runtime)
    places = config.lm.concurrency
    server = uvicorn.Server(uvicorn.Config(make_app(asker, places), host=host, port=port, log_level="warning"))
    server.install_signal_handlers = lambda: None  # the main thread waits for the stop signals itself
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        thread.join(0.05)
    if not server.started:
        raise HyperProveError(f"could not serve on {host}:{port} (is the port free?)")
    url = f"http://{host}:{port}/"
    log(f"serving {index_directory} at {url} ({places} question(s) at a time; POST {url}ask, GET {url}health; Ctrl-C stops it)")
    how = wait_until_stopped(stop)
    server.should_exit = True
    thread.join(10)
    traced = asker.runtime.traces.close() if asker.runtime.traces_started else 0
    log(f"serve stopped ({how})" + (f"; {traced} questions traced in MLflow experiment {config.tracking.experiment!r}" if traced else ""))
    return {"url": url, "index": str(index_directory)}
