"""What a user sees when serve, serve-lm and ui: hosts, origins, bodies, hung LMs, stops: each case ends in one line naming the problem
(exit 2) or in preserved state, never in a traceback, a lost folder or a silently wrong result."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.bench.attacks import HangingLM
from experiments.bench.postgres import free_port
from modules.errors import HyperProveError
from pipeline.runtime import Runtime
from tests.support import HashEmbedder, JSONServer, dead_pid, one_line, run, score_alpha, two_hop_script


def test_a_killed_workers_running_trial_is_failed_and_asked_again(tmp_path):
    import optuna

    from optimize.study import WORKER, open_study, run_trials
    from pipeline.config import SweepConfig

    sweep = SweepConfig(trials=3, storage=f"sqlite:///{tmp_path}/k.db", study="k")
    study = open_study(sweep)
    with pytest.warns(UserWarning, match="Heartbeat"):  # Optuna's note that study.optimize beats its heart, not ask()
        lost = study.ask()  # what a SIGKILL leaves: a trial RUNNING, its process gone
    lost.set_user_attr(WORKER, {"host": __import__("socket").gethostname(), "pid": dead_pid()})
    alpha = lost.suggest_float("alpha", 0.0, 1.0)
    study = run_trials(sweep, list(range(4)), score_alpha, progress=False)
    states = [t.state for t in study.trials]
    assert states[0] == optuna.trial.TrialState.FAIL and states.count(optuna.trial.TrialState.RUNNING) == 0
    assert study.trials[1].params["alpha"] == alpha  # the lost trial, asked again first
    assert sum(s in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for s in states) == 3


def test_ui_refuses_a_non_loopback_host_without_allow_remote(capsys, tmp_path):
    code, _, err = run(capsys, "ui", "--host", "0.0.0.0", "--tracking-uri", f"sqlite:///{tmp_path}/m.db")
    assert code == 2
    assert one_line(err) == ("--host 0.0.0.0: would serve the tracking store, unauthenticated, beyond this machine; "
                             "add --allow-remote if that is what you want")
    from experiments.runs.tracking import ui_command
    from pipeline.config import TrackingConfig

    command, _ = ui_command(TrackingConfig(uri=f"sqlite:///{tmp_path}/m.db"), "0.0.0.0", 5000, allow_remote=True)
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert ui_command(TrackingConfig(uri=f"sqlite:///{tmp_path}/m.db"), "::1", 5000)[0]  # loopback needs no flag


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (Linux /proc)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return children + [d for child in children for d in descendants(child)]


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_ui_stops_its_whole_server_and_takes_no_artifact_uploads(tmp_path, stop):
    """A closed terminal (SIGHUP) or SIGTERM used to leave `mlflow server` and its uvicorn
    answering; and the server took unauthenticated uploads into ./mlartifacts."""
    import signal
    import time
    import urllib.error
    import urllib.request

    from pipeline.files import process_alive

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ui = subprocess.Popen([str(Path(sys.executable).with_name("hyperprove")), "ui", "--port", str(port), "--tracking-uri",
                           f"sqlite:///{tmp_path}/m.db"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        else:
            pytest.fail("the MLflow UI did not start within 120 s")
        upload = urllib.request.Request(f"{url}/api/2.0/mlflow-artifacts/artifacts/planted.txt", data=b"x", method="PUT")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(upload, timeout=10)
        assert refused.value.code == 503 and not (tmp_path / "mlartifacts").exists()
        server = descendants(ui.pid)
        assert len(server) >= 2  # mlflow server and its uvicorn
        ui.send_signal(getattr(signal, stop))
        output = ui.communicate(timeout=60)[0].decode()
        assert ui.returncode == 0 and f"MLflow UI stopped ({stop}), with every process it started" in output
        assert not any(process_alive(pid) for pid in server)
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{url}/health", timeout=2)
    finally:
        if ui.poll() is None:
            ui.kill()


@pytest.fixture
def served_index(files, capsys):
    code, _, _ = run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")
    assert code == 0
    return files / "idx"


def own_page_client(served_index, lm=None, hosts=()):
    from dspy.utils import DummyLM
    from fastapi.testclient import TestClient

    from pipeline.config import HyperProveConfig
    from pipeline.serve.ask import Asker
    from pipeline.serve.server import make_app

    config = HyperProveConfig().with_overrides(index={"embedder": "test-hash"}, tracking={"enabled": False, "traces": False})
    asker = Asker(config, served_index, Runtime(config, lm=lm or DummyLM(two_hop_script(final_answer="2017")), embedder=HashEmbedder()))
    return TestClient(make_app(asker, slots=1, hosts=hosts), base_url="http://127.0.0.1:8000")


@pytest.mark.parametrize("headers, message", [
    ({"Host": "rebound.example.com:8000"}, "Host 'rebound.example.com:8000' is not a name of this server"),
    ({"Origin": "http://evil.example"}, "a request from the page of 'http://evil.example', not this server's own"),
    ({"Origin": "http://localhost:8000"}, "a request from the page of 'http://localhost:8000', not this server's own"),
    ({"Sec-Fetch-Site": "cross-site"}, "a request from another site's page"),
])
def test_serve_refuses_requests_from_other_sites_and_other_host_names(served_index, headers, message):
    client = own_page_client(served_index)
    for method, path in (("post", "/ask"), ("get", "/ask/stream?question=x"), ("get", "/health"), ("get", "/")):
        response = getattr(client, method)(path, headers=headers, **({"json": {"question": "Who?"}} if method == "post" else {}))
        assert (response.status_code, response.json()) == (403, {"error": message}), path
    # its own page and programs on this machine are answered
    assert client.get("/health", headers={"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"}).status_code == 200
    assert client.get("/health", headers={"Host": "localhost:8000"}).status_code == 200
    # bound to a named interface, that name is the server's too
    assert own_page_client(served_index, hosts=("box.lan",)).get("/health", headers={"Host": "box.lan:8000"}).status_code == 200


def test_serve_takes_only_json_posts_of_a_small_body_and_says_why_in_one_line(served_index):
    client = own_page_client(served_index)
    plain = client.post("/ask", content=b'{"question": "Who directed Jaws?"}', headers={"Content-Type": "text/plain"})
    assert (plain.status_code, plain.json()) == (415, {"error": "the body must be application/json, not text/plain"})
    form = client.post("/ask", data={"question": "Who directed Jaws?"})
    assert form.status_code == 415
    deep = client.post("/ask", content=b"[" * 8000 + b"]" * 8000, headers={"Content-Type": "application/json"})
    assert (deep.status_code, deep.json()) == (400, {"error": "the body's JSON is nested too deeply"})
    surrogate = client.post("/ask", content=b'{"question": "Who \\ud800 directed Jaws?"}', headers={"Content-Type": "application/json"})
    assert surrogate.status_code == 422 and "which is not text" in surrogate.json()["error"]
    latin = client.post("/ask", content=b'{"question": "Caf\xe9?"}', headers={"Content-Type": "application/json"})
    assert (latin.status_code, latin.json()) == (400, {"error": "the body is not UTF-8 text"})
    assert client.get("/ask/stream?question=Who%ED%A0%80%FF").status_code in (200, 422)  # undecodable bytes: never a 500
    assert client.get("/docs").status_code == 404 and client.get("/openapi.json").status_code == 404


def test_a_body_over_the_cap_is_refused_before_it_is_read(served_index):
    """A 300 MB body is refused by its Content-Length before one byte is read, and a body that
    does not say its length as soon as it passes the cap."""
    import asyncio

    from pipeline.serve.server import MAX_BODY

    app = own_page_client(served_index).app

    def call(headers, chunks):
        reads, sent = [], []

        async def receive():
            reads.append(1)
            if chunks:
                return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": "/ask", "raw_path": b"/ask", "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
                 "client": ("127.0.0.1", 5000), "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), *headers]}
        asyncio.run(app(scope, receive, send))
        return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:])), len(reads)

    assert call([(b"content-length", b"300000000")], [b"x" * 1024] * 10) == (413, {"error": f"the body is 300000000 bytes; at most {MAX_BODY}"}, 0)
    status, body, reads = call([], [b"x" * 4096] * 1000)  # chunked: no length given
    assert (status, body) == (413, {"error": f"the body is over {MAX_BODY} bytes"}) and reads == MAX_BODY // 4096 + 1


def test_a_question_whose_client_left_while_it_waited_is_dropped_not_answered():
    import asyncio
    import threading

    from pipeline.serve.server import AnswerSlots, Gone

    answered, hold = [], threading.Event()

    async def scene() -> AnswerSlots:
        queue = AnswerSlots(slots=1)
        holding = await queue.run(lambda: hold.wait(10) and answered.append("first") or {})  # takes the one slot
        left = asyncio.Event()
        waiting = asyncio.ensure_future(queue.run(lambda: answered.append("dropped") or {}, gone=left.wait))
        await asyncio.sleep(0.05)
        assert queue.waiting == 1
        left.set()  # its client disconnects while it waits
        with pytest.raises(Gone):
            await waiting
        hold.set()
        await holding
        return queue

    queue = asyncio.run(scene())
    assert answered == ["first"] and queue.dropped == 1 and queue.waiting == 0 and queue.answering == 0


def test_a_hung_lm_is_a_503_within_the_stated_time(served_index):
    """An LM that accepts the connection and never replies: with a 1 s timeout and one retry the
    question is a 503 in about 1 + 1 + 1 s (backoff), not an hour."""
    import time

    from fastapi.testclient import TestClient

    from pipeline.config import HyperProveConfig
    from pipeline.serve.ask import Asker
    from pipeline.serve.server import make_app

    hanging = HangingLM()
    try:
        config = HyperProveConfig().with_overrides(index={"embedder": "test-hash"}, tracking={"enabled": False, "traces": False},
                                                   lm={"api_base": hanging.address, "timeout": 1, "retries": 1})
        asker = Asker(config, served_index, Runtime(config, embedder=HashEmbedder()))
        client = TestClient(make_app(asker, slots=1), base_url="http://127.0.0.1:8000")
        started = time.perf_counter()
        response = client.post("/ask", json={"question": "Who directed Jaws?"})
        seconds = time.perf_counter() - started
    finally:
        hanging.close()
    assert response.status_code == 503 and "error" in response.json(), response.text
    assert seconds < config.lm.give_up_seconds + 10, seconds


def test_sigterm_ends_serve_within_seconds_while_a_question_hangs(served_index, tmp_path):
    import signal
    import time
    import urllib.request

    port, hanging = free_port(), HangingLM()
    script = (f"from pipeline.cli import main; from pipeline.runtime import Runtime; from tests.support import HashEmbedder; "
              f"raise SystemExit(main(['serve', {str(served_index)!r}, '--port', '{port}', '--embedder', 'test-hash', '--no-track', "
              f"'--api-base', {hanging.address!r}, '--lm-timeout', '600'], make_runtime=lambda c: Runtime(c, embedder=HashEmbedder())))")
    process = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.3)
        asking = threading_post(f"http://127.0.0.1:{port}/ask", {"question": "Who directed Jaws?"})
        time.sleep(1.5)  # the question is now waiting on the LM
        started = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        seconds = time.perf_counter() - started
    finally:
        process.kill()
        hanging.close()
    out = process.stdout.read()
    assert process.returncode == 0 and "serve stopped (SIGTERM)" in out, out
    assert seconds < 10, seconds
    asking.join(5)


def threading_post(url: str, body: dict):
    import threading
    import urllib.request

    def post():
        try:
            urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=30)
        except OSError:
            pass

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def Upstream() -> JSONServer:  # noqa: N802 - stands in for a class
    """A stand-in for llama.cpp's server: answers every path (`/props` names a file under $HOME)
    and reflects any Origin in its CORS headers, as llama.cpp does."""

    def answer(request, body):
        cors = {"Access-Control-Allow-Origin": request.headers.get("origin") or "*"}
        if body is None:
            return 200, {"path": request.path, "model_path": "/home/someone/.cache/model.gguf"}, cors
        return 200, {"path": request.path, "body": json.loads(body), "origin": request.headers.get("origin")}, cors

    return JSONServer(answer)


def test_serve_lm_passes_only_the_api_to_programs_and_nothing_to_web_pages():
    from starlette.testclient import TestClient

    from pipeline.lm.local import guard

    upstream = Upstream()
    try:
        with TestClient(guard(upstream.address, ()), base_url="http://127.0.0.1:8080") as client:
            completion = client.post("/v1/chat/completions", json={"messages": []})
            assert completion.status_code == 200 and completion.json()["body"] == {"messages": []}
            assert not [name for name in completion.headers if name.startswith("access-control-")]
            assert client.get("/health").status_code == 200 and client.get("/v1/models").status_code == 200
            props = client.get("/props")
            assert props.status_code == 404 and "model_path" not in props.text
            for headers in ({"Origin": "http://evil.example"}, {"Origin": "http://127.0.0.1:8080"}, {"Sec-Fetch-Site": "cross-site"},
                            {"Host": "rebound.example.com:8080"}):
                refused = client.post("/v1/chat/completions", json={"messages": []}, headers=headers)
                assert refused.status_code == 403 and "model_path" not in refused.text, headers
            options = client.options("/v1/chat/completions", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
            assert options.status_code == 403 and "access-control-allow-origin" not in options.headers
    finally:
        upstream.server.shutdown()


def test_serve_lm_binds_its_guard_and_llama_cpp_listens_on_loopback_only(monkeypatch):
    import threading
    import urllib.error
    import urllib.request

    import pipeline.lm.local as local_model
    from pipeline.config import LMConfig

    upstream = Upstream()

    class FakeServer:
        def __init__(self, *args, **kwargs):
            assert "adjust" not in kwargs  # llama.cpp keeps its own loopback port; nothing rebinds it
            self.address = upstream.address

    monkeypatch.setattr(local_model, "LocalServer", FakeServer)
    monkeypatch.setattr(local_model, "local_model_path", lambda folder: Path("model.gguf"))
    port, stop, lines, seen = free_port(), threading.Event(), [], {}

    def client():  # while serve-lm runs in the main thread (it waits for the stop signals there)
        try:
            for _ in range(100):
                if lines:
                    break
                threading.Event().wait(0.1)
            asked = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", b'{"messages": []}', {"Content-Type": "application/json"})
            seen["completion"] = json.loads(urllib.request.urlopen(asked, timeout=10).read())["path"]
            for name, request in (("props", urllib.request.Request(f"http://127.0.0.1:{port}/props")),
                                  ("page", urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Origin": "http://evil.example"}))):
                try:
                    urllib.request.urlopen(request, timeout=10)
                except urllib.error.HTTPError as refused:
                    seen[name] = refused.code
        finally:
            stop.set()

    asking = threading.Thread(target=client)
    asking.start()
    try:
        local_model.serve_local_model(LMConfig(), "127.0.0.1", port, log=lines.append, stop=stop)
    finally:
        asking.join(20)
        upstream.server.shutdown()
    assert seen == {"completion": "/v1/chat/completions", "props": 404, "page": 403}
    assert "programs only, no web page's requests" in lines[0] and lines[-1] == "serve-lm stopped (stop)"


def test_a_question_that_is_not_text_is_one_line(served_index, capsys):
    code, _, err = run(capsys, "ask", served_index, "Who \udcff directed Jaws?", "--embedder", "test-hash")
    assert code == 2 and one_line(err) == "the question holds '\\udcff' at character 4, which is not text (a lone surrogate or a byte that is not UTF-8)"


def test_serve_gives_the_runtime_it_answers_with_the_lm_bounds_it_states(served_index, capsys):
    seen = []

    def runtime(config):
        seen.append(config.lm)
        raise HyperProveError("stopped before serving")

    code, _, err = run(capsys, "serve", served_index, "--embedder", "test-hash", "--api-base", "http://127.0.0.1:9/v1", runtime=runtime)
    assert code == 2 and one_line(err) == "stopped before serving"
    assert (seen[0].request_timeout, seen[0].request_retries, seen[0].give_up_seconds) == (120, 1, 241)
