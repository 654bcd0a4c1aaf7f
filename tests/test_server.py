"""`hyperprove serve`: the JSON API, its errors, 50 questions at once, the event stream, and the
page in a real browser (headless Chromium, where installed)."""

import asyncio
import json
import shutil
import threading

import httpx
import pytest
from fastapi.testclient import TestClient

from experiments.bench.check_pages import Rendered as Page
from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig
from pipeline.serve.ask import Asker
from pipeline.serve.server import MAX_QUESTION, make_app, serve
from tests.support import CORPUS, Scripted

QUESTION = "Who was the mother of the director of Jaws?"
ANSWERS = {
    "`[[ ## sub_questions ## ]]`": {"sub_questions": ["Who directed Jaws?", "Who was the mother of #1?"]},
    "[[ ## question ## ]]\nWho directed Jaws?\n": {"answer": "Steven Spielberg", "supporting": [1]},
    "[[ ## question ## ]]\nWho was the mother of Steven Spielberg?\n": {"answer": "Leah Adler", "supporting": [1]},
    f"[[ ## question ## ]]\n{QUESTION}": {"answer": "Leah Adler"},
}
LOCAL = "http://127.0.0.1:8000"  # the Host the server answers to (a loopback name)
CONFIG = HyperProveConfig().with_overrides(index={"embedder": "test-hash"}, tracking={"enabled": False, "traces": False})


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    """The test corpus as a folder of two documents, indexed with the hashing embedder."""
    from pipeline.cli import main

    folder = tmp_path_factory.mktemp("serve")
    (folder / "docs").mkdir()
    (folder / "docs" / "films.json").write_text(json.dumps(CORPUS[:2]))
    (folder / "docs" / "people.md").write_text(f"# {CORPUS[2]['title']}\n\n{CORPUS[2]['text']}\n")
    assert main(["index", str(folder / "docs"), "--out", str(folder / "idx"), "--embedder", "test-hash"], make_runtime=Scripted()) == 0
    return folder / "idx"


def asker_for(index_dir, answers=ANSWERS, lm=None):
    from dspy.utils import DummyLM

    from pipeline.runtime import Runtime
    from tests.support import HashEmbedder

    return Asker(CONFIG, index_dir, Runtime(CONFIG, lm=lm or DummyLM(answers), embedder=HashEmbedder()))


@pytest.fixture(scope="module")
def client(index_dir):
    return TestClient(make_app(asker_for(index_dir), slots=1), base_url=LOCAL)


def test_ask_returns_the_answer_its_chain_and_where_its_passages_came_from(client):
    response = client.post("/ask", json={"question": QUESTION})
    assert response.status_code == 200
    record = response.json()
    assert record["answer"] == "Leah Adler"
    assert [(hop["sub_question"], hop["query"], hop["answer"]) for hop in record["chain"]] == [
        ("Who directed Jaws?", "Who directed Jaws?", "Steven Spielberg"),
        ("Who was the mother of #1?", "Who was the mother of Steven Spielberg?", "Leah Adler")]
    assert record["lm_calls"] == 4 and record["fallbacks"] == []  # decompose, two hop answers, the final reader (bridges by rule)
    # the shape of `ask --json`, and each top passage with its text and file
    assert {"question", "answer", "chain", "fallbacks", "passages", "lm", "lm_calls", "lm_steps", "seconds", "sources"} <= set(record)
    by_id = {source["id"]: source for source in record["sources"]}
    assert by_id[2] == {"id": 2, "title": "Leah Adler", "text": CORPUS[2]["text"], "source": "people.md#0"}
    assert by_id[0]["source"] == "films.json#0"


@pytest.mark.parametrize("body, status, message", [
    (b"not json", 400, "the body is not JSON"),
    (b"[1, 2]", 422, 'expected a JSON object with "question"'),
    (b'{"q": "x"}', 422, 'expected a JSON object with "question"'),
    (b'{"question": 42}', 422, '"question" must be a string, found int'),
    (b'{"question": "   "}', 422, '"question" is empty'),
    (json.dumps({"question": "x" * (MAX_QUESTION + 1)}).encode(), 413, f'"question" is {MAX_QUESTION + 1} characters long; at most {MAX_QUESTION}'),
])
def test_a_bad_request_is_a_4xx_with_one_line(client, body, status, message):
    response = client.post("/ask", content=body, headers={"content-type": "application/json"})
    assert (response.status_code, response.json()) == (status, {"error": message})


def test_the_stream_refuses_a_missing_question(client):
    response = client.get("/ask/stream")
    assert (response.status_code, response.json()) == (422, {"error": '"question" is empty'})


def test_fifty_questions_at_once_are_all_answered_one_at_a_time(index_dir):
    """With the local model's one place, 50 concurrent requests queue and every one is answered."""
    asker = asker_for(index_dir)
    app = make_app(asker, slots=1)
    running, most = [0], [0]
    forward = asker.program.forward

    def counted(question):
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            return forward(question)
        finally:
            running[0] -= 1

    asker.program.forward = counted  # the program, as the app runs it, counts the questions in it at once

    async def fifty():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=LOCAL, timeout=120) as http:
            responses = await asyncio.gather(*(http.post("/ask", json={"question": QUESTION}) for _ in range(50)))
            health = (await http.get("/health")).json()
        return responses, health

    responses, health = asyncio.run(fifty())
    assert [r.status_code for r in responses] == [200] * 50
    assert {r.json()["answer"] for r in responses} == {"Leah Adler"}
    assert most[0] == 1 and (health["answering"], health["waiting"], health["slots"]) == (0, 0, 1)


def test_questions_answered_at_once_each_get_their_own_lm_bill(index_dir):
    """With an API model's answer slots, questions run in the program together; each record counts its
    own four calls (decompose, two hops, the final reader), never another question's."""
    import time

    from dspy.utils import DummyLM

    class Slow(DummyLM):  # every call takes long enough for the four questions' calls to interleave
        def forward(self, *args, **kwargs):
            time.sleep(0.02)
            return super().forward(*args, **kwargs)

    asker = asker_for(index_dir, lm=Slow(ANSWERS))
    together = threading.Barrier(4)
    forward = asker.program.forward

    def at_once(question):
        together.wait(timeout=30)
        return forward(question)

    asker.program.forward = at_once

    async def four():
        transport = httpx.ASGITransport(app=make_app(asker, slots=4))
        async with httpx.AsyncClient(transport=transport, base_url=LOCAL, timeout=120) as http:
            return await asyncio.gather(*(http.post("/ask", json={"question": QUESTION}) for _ in range(4)))

    records = [response.json() for response in asyncio.run(four())]
    assert [record["lm_calls"] for record in records] == [4] * 4
    assert [{step: cost["calls"] for step, cost in record["lm_steps"].items()} for record in records] == [
        {"Decomposer": 1, "HopAnswerer": 2, "AnswerGenerator": 1}] * 4
    assert asker.runtime.session.profile.calls == 16


def events(text: str) -> list[tuple[str, dict]]:
    found = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        found.append((lines["event"], json.loads(lines["data"])))
    return found


def test_the_stream_sends_the_plan_each_hop_then_the_chain(client):
    response = client.get("/ask/stream", params={"question": QUESTION})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    sent = events(response.text)
    assert [name for name, _ in sent] == ["plan", "hop", "hop", "answer"]
    assert sent[0][1]["sub_questions"] == ["Who directed Jaws?", "Who was the mother of #1?"]
    assert sent[0][1]["html"].count("<li>") == 2
    first_hop = Page(sent[1][1]["html"])
    assert first_hop.classes["hop-answer"] == ["Steven Spielberg"] and sent[1][1]["hop"]["answer"] == "Steven Spielberg"
    final = sent[3][1]
    assert final["record"]["answer"] == "Leah Adler"
    page = Page(final["html"])
    assert page.classes["hop-answer"] == ["Steven Spielberg", "Leah Adler"] and "answer" in page.ids
    assert "people.md#0" in final["html"]  # where the top passages came from


def test_a_question_the_lm_cannot_parse_still_answers_with_its_fallbacks(index_dir):
    client = TestClient(make_app(asker_for(index_dir, answers={"": {"nothing": "useful"}}), slots=1), base_url=LOCAL)
    response = client.post("/ask", json={"question": QUESTION})
    assert response.status_code == 200
    assert response.json()["fallbacks"] and isinstance(response.json()["answer"], str)


def test_an_lm_that_is_gone_is_a_503_with_one_line(index_dir):
    from dspy.utils import DummyLM
    from dspy.utils.exceptions import LMTransportError

    class GoneLM(DummyLM):
        def forward(self, *args, **kwargs):
            raise LMTransportError("connection refused")

    client = TestClient(make_app(asker_for(index_dir, lm=GoneLM({})), slots=1), base_url=LOCAL)
    response = client.post("/ask", json={"question": QUESTION})
    assert response.status_code == 503
    assert response.json() == {"error": "the LM could not be reached: LMTransportError: connection refused"}
    sent = events(client.get("/ask/stream", params={"question": QUESTION}).text)
    assert sent[-1] == ("failure", {"status": 503, "error": "the LM could not be reached: LMTransportError: connection refused"})


def serving(index_dir, visit):
    """`serve` in this (the main) thread, as the command runs it, and `visit(url)` in another,
    which stops the server when it is done; what `visit` returned, and what `serve` logged."""
    from experiments.bench.postgres import free_port

    lines, outcome, stop = [], {}, threading.Event()

    def client():
        try:
            while not lines:
                stop.wait(0.05)
            outcome["value"] = visit(lines[0].split(" at ")[1].split()[0])
        except BaseException as error:  # noqa: BLE001 - raised again in the test's thread
            outcome["error"] = error
        finally:
            stop.set()

    threading.Thread(target=client, daemon=True).start()
    serve(CONFIG, str(index_dir), port=free_port(), runtime=asker_for(index_dir).runtime, log=lines.append, stop=stop)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], lines


def test_serve_binds_loopback_unless_told_and_stops_on_request(index_dir):
    with pytest.raises(HyperProveError, match="--host 0.0.0.0: would serve questions over this index, unauthenticated"):
        serve(CONFIG, index_dir, host="0.0.0.0", port=8000, runtime=None, log=lambda line: None)
    (health, page), lines = serving(index_dir, lambda url: (httpx.get(url + "health").json(), httpx.get(url).text))
    assert health["passages"] == 3 and health["slots"] == 1 and '<form id="ask">' in page
    assert lines[0].startswith("serving ") and lines[-1] == "serve stopped (stop)"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_the_page_in_a_browser_shows_the_hops_and_the_answer(index_dir, tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api", reason="the browser test drives Chromium with Playwright (pip install playwright)")

    def visit(url):
        with playwright_api.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"])
            page = browser.new_page()
            page.goto(url)
            page.fill("#question", QUESTION)
            page.click("#send")
            page.wait_for_selector("#chain #answer", timeout=30_000)
            seen = {"answer": page.inner_text("#chain #answer"), "hops": page.locator("#chain .hop-answer").all_inner_texts(),
                    "path": page.inner_text("#chain .path"), "status": page.inner_text("#status"), "url": page.url}
            page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
            browser.close()
            return seen

    seen, _ = serving(index_dir, visit)
    assert seen["answer"] == "Leah Adler" and seen["hops"] == ["Steven Spielberg", "Leah Adler"]
    assert seen["path"] == "Who directed Jaws? → Steven Spielberg ⇒ Who was the mother of #1? → Leah Adler ⇒ Leah Adler"
    assert seen["status"].startswith("answered in ") and seen["status"].endswith(" s with 4 LM calls")
    assert seen["url"].endswith("/?q=Who%20was%20the%20mother%20of%20the%20director%20of%20Jaws%3F")
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
