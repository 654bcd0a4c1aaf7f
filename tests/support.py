"""What several test files share: the tiny corpus and questions, scripted LMs and endpoints, and
running the command line."""



import gzip
import hashlib
import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from pipeline.cli import main
from pipeline.runtime import Runtime


class HashEmbedder:
    """Bag-of-words hashing into 256 dimensions: deterministic, instant, similar texts are close."""

    id = "test-hash"
    dim = 256

    def encode(self, texts, progress=None) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)

    def encode_query(self, text: str) -> np.ndarray:
        return self.encode([text])[0]

    def load(self) -> None:
        """Nothing to load (the real embedder loads its model here)."""

    def forget_queries(self) -> None:
        """Nothing cached."""


CORPUS = [
    {"title": "Jaws (film)", "text": "Jaws is a 1975 thriller film directed by Steven Spielberg."},
    {"title": "Steven Spielberg", "text": "Steven Spielberg is an American film director. His mother was Leah Adler."},
    {"title": "Leah Adler", "text": "Leah Adler was an American restaurateur. She died in Los Angeles in 2017."},
    {"title": "Cincinnati", "text": "Cincinnati is a city in Ohio on the Ohio River."},
    {"title": "Ohio River", "text": "The Ohio River is a tributary of the Mississippi River."},
]


QUESTIONS = [{
    "id": "q1", "question": "When did the mother of the director of Jaws die?", "answer": "2017", "type": "3hop1",
    "gold_passages": [0, 1, 2],
    "decomposition": [
        {"question": "Who directed Jaws?", "answer": "Steven Spielberg", "passage": 0},
        {"question": "Who was the mother of #1?", "answer": "Leah Adler", "passage": 1},
        {"question": "When did #2 die?", "answer": "2017", "passage": 2},
    ],
}]


TRAIN = [
    {"id": "t1", "question": "Who was the mother of the director of Jaws?", "answer": "Leah Adler", "gold_passages": [0, 1],
     "decomposition": [{"question": "Who directed Jaws?", "answer": "Steven Spielberg", "passage": 0},
                       {"question": "Who was the mother of #1?", "answer": "Leah Adler", "passage": 1}]},
    {"id": "t2", "question": "Where did the director of Jaws' mother die?", "answer": "Los Angeles", "gold_passages": [0, 1, 2],
     "decomposition": [{"question": "Who directed Jaws?", "answer": "Steven Spielberg", "passage": 0},
                       {"question": "Who was the mother of #1?", "answer": "Leah Adler", "passage": 1},
                       {"question": "Where did #2 die?", "answer": "Los Angeles", "passage": 2}]},
    {**QUESTIONS[0], "id": "v1"},
]


# eight questions with prompts of their own (the script keys on the question's start), two batches per worker
MANY = [{**QUESTIONS[0], "id": f"q{k}", "question": f"{QUESTIONS[0]['question']} (case {k})"} for k in range(1, 9)]


def two_hop_script(final_answer: str) -> dict:
    """DummyLM answers for QUESTIONS[0] decomposed into two hops, then the given final answer."""
    return {
        "`[[ ## sub_questions ## ]]`": {"sub_questions": ["Who directed Jaws?", "Who was the mother of #1?"]},
        "[[ ## sub_question ## ]]": {"question": "Who was the mother of Steven Spielberg?"},
        "[[ ## question ## ]]\nWho directed Jaws?\n": {"answer": "Steven Spielberg", "supporting": [1]},
        "[[ ## question ## ]]\nWho was the mother of Steven Spielberg?\n": {"answer": "Leah Adler", "supporting": [1]},
        f"[[ ## question ## ]]\n{QUESTIONS[0]['question']}": {"answer": final_answer},
    }


class Scripted:
    """A runtime for `main`: a DummyLM answering from `answers` (set before the command runs),
    and the hashing embedder; `last` is the runtime of the latest command."""

    answers: dict = {}
    last = None

    def __call__(self, config):
        from dspy.utils import DummyLM

        from pipeline.runtime import Runtime
        
        self.last = Runtime(config, lm=DummyLM(self.answers), embedder=HashEmbedder())
        return self.last


def run(capsys, *argv, runtime=None):
    code = main([str(a) for a in argv], make_runtime=runtime or (lambda config: Runtime(config, embedder=HashEmbedder())))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(err: str) -> str:
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    return err[len("error: "):-1]


def reply(fields: dict) -> str:
    """A ChatAdapter reply with these output fields."""
    parts = [f"[[ ## {name} ## ]]\n{value if isinstance(value, str) else json.dumps(value)}" for name, value in fields.items()]
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


class ScriptedEndpoint:
    """An OpenAI-compatible /v1/chat/completions answering from a script (prompt substring ->
    output fields, as DSPy's DummyLM takes them); `requests` holds the messages that reached it.
    Once `limit` requests are answered, it drops every connection unanswered (a server gone)."""

    def __init__(self, script: dict, limit: int | None = None):
        self.script, self.requests, self.limit = script, [], limit
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if endpoint.limit is not None and len(endpoint.requests) >= endpoint.limit:
                    self.close_connection = True
                    return
                endpoint.requests.append(body["messages"])
                text = "\n".join(str(m.get("content")) for m in body["messages"])
                fields = next((fields for needle, fields in endpoint.script.items() if needle in text), {})
                payload = json.dumps({"id": "scripted", "object": "chat.completion", "created": 0, "model": body["model"],
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": reply(fields)}}],
                                      "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


class JSONServer:
    """A loopback HTTP server answering every GET and POST with JSON: `answer(request, body)`
    gives (status, payload, extra headers), `body` being the POST's bytes (None for a GET)."""

    def __init__(self, answer):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.respond(None)

            def do_POST(self):
                self.respond(self.rfile.read(int(self.headers.get("content-length", 0))))

            def respond(self, body):
                status, payload, headers = answer(self, body)
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def rows(path) -> list[dict]:
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    return [json.loads(line) for line in lines]


def metrics(summary: dict) -> dict:
    return {key: summary[key] for key in ("n", "em", "f1", "recall@2", "recall@5", "lm_calls_per_question", "per_type", "failures")
            if key in summary}


def dead_pid() -> int:
    """The id of a process that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def score_alpha(params, chunk):
    return [{"recall@5": 1.0 - (params["alpha"] - 0.7) ** 2, "recall@2": 0.0} for _ in chunk]
