"""`hyperprove serve IDX`: answers with their evidence over HTTP, and a page that shows each hop as
it is answered.

    POST /ask {"question": "..."}     the answer record of `ask --json`: the chain, the top passages' text and files
    GET  /ask/stream?question=...     the same as server-sent events: queued, plan, hop (each), answer | failure
    GET  /                            the page: a question box; plan, hops and chain appear as they stream
    GET  /health                      the index, the LM, questions answering and waiting

Questions wait their turn in arrival order for one of `lm.concurrency` answer slots (1 with the local
model, whose one server slot would only interleave two questions' calls; 8 with an API model),
and run in threads beside the event loop; a question whose client has gone while it waited is
dropped. A question the program cannot answer well still returns its fallbacks as any answer
does; an LM that is gone is a 503 and bad input a 4xx, each with a one-line JSON error, never a
traceback.

The server answers only its own page: a request whose `Host` is not a name of this server
(DNS rebinding), that comes from another site's page (`Origin`, `Sec-Fetch-Site`), or that posts
anything but JSON (a "simple" cross-site form post) is refused before any work, and a body over
`MAX_BODY` bytes before it is read. The page loads no script from elsewhere, and there is no
`/docs` (whose JavaScript would come from a CDN).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Awaitable, Callable, Collection

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from modules.errors import HyperProveError
from pipeline.index.corpus import text_problem
from pipeline.serve.http import OwnPageOnly, Served, check_host, error, host_names, read_body, wait_until_stopped
from pipeline.serve.pages import chain_parts, chain_view, live_page

MAX_QUESTION = 2000  # characters: a question, not a document
MAX_BODY = 16_384  # bytes of a POST body: a question of MAX_QUESTION characters, escaped, fits
log = logging.getLogger("hyperprove.serve")
# A person waits on each question: an LM request gets SERVE_TIMEOUT seconds and SERVE_RETRIES
# retries unless the config says otherwise, so a hung LM is a 503 within about 4 minutes.
SERVE_TIMEOUT, SERVE_RETRIES = 120.0, 1
STOP_SECONDS = 3  # a stop waits this long for open connections, then closes them


def question_problem(value) -> tuple[int, str] | None:
    """What is wrong with a request's question (a status and one line), or None."""
    if not isinstance(value, str):
        return 422, f'"question" must be a string, found {type(value).__name__}'
    if not value.strip():
        return 422, '"question" is empty'
    if len(value) > MAX_QUESTION:
        return 413, f'"question" is {len(value)} characters long; at most {MAX_QUESTION}'
    if problem := text_problem(value):
        return 422, f'"question" {problem}'
    return None


async def read_json_body(request: Request) -> tuple[object, JSONResponse | None]:
    """The JSON body of a POST, or the one-line error that refuses it: a type other than JSON, a
    body over `MAX_BODY` bytes (refused before it is read, or as soon as it passes the cap), JSON
    that does not parse or nests too deeply."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        return None, error(415, f"the body must be application/json, not {kind or 'untyped'}")
    body, refused = await read_body(request, MAX_BODY)
    if refused is not None:
        return None, refused
    try:
        return json.loads(body), None
    except UnicodeDecodeError:
        return None, error(400, "the body is not UTF-8 text")
    except ValueError:
        return None, error(400, "the body is not JSON")
    except RecursionError:
        return None, error(400, "the body's JSON is nested too deeply")


def failure(exception: BaseException) -> tuple[int, str]:
    """The status and one line for a question that could not be answered at all."""
    from pipeline.lm.session import LM_UNAVAILABLE

    if isinstance(exception, LM_UNAVAILABLE):
        return 503, f"the LM could not be reached: {type(exception).__name__}: {str(exception).splitlines()[0] if str(exception) else ''}".rstrip(": ")
    if isinstance(exception, HyperProveError):
        return 400, str(exception)
    log.exception("a question failed")
    return 500, f"the question could not be answered: {type(exception).__name__}"


class Gone(Exception):
    """The client of a waiting question went away: it is dropped, not answered."""


class AnswerSlots:
    """Slots to answer a question in, taken in arrival order (asyncio's semaphore is first come,
    first served), each question in a daemon thread of its own (a stop never waits for an LM
    call); a slot is given back when the question's thread ends, even if its client has gone."""

    def __init__(self, slots: int):
        self.slots, self.free = slots, asyncio.Semaphore(slots)
        self.waiting = self.answering = self.dropped = 0

    async def run(self, work: Callable[[], dict], queued: Callable[[int], None] = lambda ahead: None,
                  gone: Callable[[], Awaitable[object]] | None = None) -> asyncio.Future:
        """`work` in a thread once a slot is free (`queued(ahead)` first, when none is); `Gone`
        when `gone()` returns first (its client disconnected while it waited)."""
        if self.answering >= self.slots:
            queued(self.waiting)
        self.waiting += 1
        try:
            await self.take_slot(gone)
        finally:
            self.waiting -= 1
        self.answering += 1
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def settle(result=None, exception: BaseException | None = None) -> None:  # in the event loop
            self.give_back()
            if not done.cancelled():
                done.set_exception(exception) if exception is not None else done.set_result(result)

        def answer() -> None:
            try:
                result = work()
            except BaseException as exception:  # noqa: BLE001 - handed to the request, which says it in one line
                loop.call_soon_threadsafe(settle, None, exception)
            else:
                loop.call_soon_threadsafe(settle, result)

        threading.Thread(target=answer, name="question", daemon=True).start()
        return done

    async def take_slot(self, gone: Callable[[], Awaitable[object]] | None) -> None:
        """Wait for a free slot, or raise `Gone` when `gone()` returns first."""
        if gone is None:
            await self.free.acquire()
            return
        taking, leaving = asyncio.ensure_future(self.free.acquire()), asyncio.ensure_future(gone())
        await asyncio.wait({taking, leaving}, return_when=asyncio.FIRST_COMPLETED)
        if not leaving.done():
            leaving.cancel()
            return
        if taking.done():
            self.free.release()  # it got the slot as its client left: the next question takes it
        else:
            taking.cancel()
        self.dropped += 1
        raise Gone

    def give_back(self) -> None:
        self.answering -= 1
        self.free.release()


async def disconnected(request: Request) -> None:
    """Returns when the client of a request whose body has been read disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def make_app(asker, slots: int, title: str = "HyperProve", hosts: Collection[str] | None = ()):
    """The FastAPI app over an `Asker` (an index and a program, loaded once), answering requests
    whose `Host` is a loopback name or address or one of `hosts` (None: any host)."""

    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(OwnPageOnly, hosts=None if hosts is None else {name.lower() for name in hosts})
    queue = app.state.queue = AnswerSlots(slots)

    def answered(question: str, listener=None) -> dict:
        return asker(question, listener)[0]

    @app.post("/ask")
    async def ask(request: Request):
        body, refused = await read_json_body(request)
        if refused is not None:
            return refused
        if not isinstance(body, dict) or "question" not in body:
            return error(422, 'expected a JSON object with "question"')
        if problem := question_problem(question := body["question"]):
            return error(*problem)
        question = question.strip()
        try:
            return await (await queue.run(lambda: answered(question), gone=lambda: disconnected(request)))
        except Gone:
            return error(499, "the client went away before its turn; not answered")
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
            waiting = await queue.run(lambda: answered(question, heard), queued=lambda ahead: events.put_nowait(("queued", {"ahead": ahead})))
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
                "answering": queue.answering, "waiting": queue.waiting, "slots": slots}

    return app


def message(event: str, data: dict) -> str:
    """One server-sent event (JSON on one line)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def served_config(config):
    """The config a server answers with: an LM request gets `SERVE_TIMEOUT` s and `SERVE_RETRIES`
    retries unless the config says otherwise (a person waits on each question). The runtime a
    caller hands `serve` must be made from this config."""
    return config.with_overrides(lm={"timeout": config.lm.timeout or SERVE_TIMEOUT,
                                     "retries": SERVE_RETRIES if config.lm.retries is None else config.lm.retries})


def serve(config, index_directory: str, host: str = "127.0.0.1", port: int = 8000, allow_remote: bool = False, runtime=None,
          log: Callable[[str], None] = print, stop: threading.Event | None = None) -> dict:
    """`hyperprove serve`: load the index and the program once, then serve until Ctrl-C, SIGTERM or
    SIGHUP (or `stop`)."""
    from pipeline.serve.ask import Asker

    check_host(host, allow_remote, "questions over this index")
    config = served_config(config)
    asker = Asker(config, index_directory, runtime)
    slots = config.lm.concurrency
    served = Served(make_app(asker, slots, hosts=host_names(host)), host, port, "questions", grace=STOP_SECONDS)
    url = f"http://{host}:{port}/"
    log(f"serving {index_directory} at {url} ({slots} question(s) at a time; POST {url}ask, GET {url}health; "
        f"an LM that does not answer is a 503 within {config.lm.give_up_seconds:.0f} s; Ctrl-C stops it)")
    how = wait_until_stopped(stop)
    served.stop()  # questions still answering are left to their daemon threads, which end with the process
    traced = asker.runtime.traces.close() if asker.runtime.traces_started else 0
    log(f"serve stopped ({how})" + (f"; {traced} questions traced in MLflow experiment {config.tracking.experiment!r}" if traced else ""))
    return {"url": url, "index": str(index_directory)}
