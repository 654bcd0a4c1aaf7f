"""The embedded model served elsewhere: `--api-base` without `--lm` sends the embedded model's own
requests to an OpenAI-compatible endpoint in another process, and a run survives that endpoint
going away (a clear error, then the same command resumes with nothing asked twice).

The endpoint in another process is `experiments.bench.replay_server`, answering from the recorded
calls of a first run made against a scripted endpoint.
"""

import json
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.config import LOCAL_MODEL_ID, LOCAL_MODEL_NAME, LMConfig
from pipeline.lm.session import make_lm
from pipeline.runtime import Runtime
from tests.support import CORPUS, MANY, HashEmbedder, ScriptedEndpoint, metrics, one_line, rows, run, two_hop_script

ROOT = Path(__file__).resolve().parents[1]


def test_api_base_without_lm_is_the_embedded_model_served_elsewhere():
    config = LMConfig(api_base="http://10.0.0.5:8080/v1")
    lm = make_lm(config)  # starts no local server
    assert lm.model == f"openai/{LOCAL_MODEL_NAME}" and lm.kwargs["api_base"] == "http://10.0.0.5:8080/v1"
    assert (config.id, config.layout) == (LOCAL_MODEL_ID, "lean-prefilled")  # the in-process model's id and prompts
    assert LMConfig(api_base="http://a:1/v1, http://b:2/v1").endpoints == ["http://a:1/v1", "http://b:2/v1"]
    with pytest.raises(Exception, match=r"api_base 'localhost:8080': expected an http:// or https:// URL"):
        LMConfig(api_base="localhost:8080")


def served(config):
    return Runtime(config, embedder=HashEmbedder())  # no LM handed in: the configured one, at --api-base


def evaluate(capsys, tmp_path, api_base, out, cache, *extra):
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    (tmp_path / "questions.json").write_text(json.dumps(MANY))
    return run(capsys, "evaluate", "--questions", tmp_path / "questions.json", "--corpus", tmp_path / "corpus.json",
               "--retriever", "hyperprove", "--decomposition", "lm", "--embedder", "test-hash", "--out", tmp_path / out,
               "--no-track", "--bridge-rewrite", "lm", "--lm-adapter", "chat", "--api-base", api_base, "--cache-dir", tmp_path / cache,
               "--json", *extra, runtime=served)


class ReplayServer:
    """`python -m experiments.bench.replay_server` in its own process."""

    def __init__(self, record: Path, delay: float = 0.0):
        self.process = subprocess.Popen([sys.executable, "-m", "experiments.bench.replay_server", str(record), "--port", "0",
                                         "--delay", str(delay)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        self.address = line.split(" at ")[1].split()[0]
        for _ in range(100):  # until it answers
            try:
                self.stats()
                break
            except OSError:
                time.sleep(0.1)

    def stats(self) -> dict:
        with urllib.request.urlopen(self.address.removesuffix("/v1") + "/stats", timeout=5) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def test_a_run_against_an_endpoint_in_another_process_gets_the_same_answers_and_survives_it_going(tmp_path, capsys):
    scripted = ScriptedEndpoint(two_hop_script(final_answer="2017"))
    code, out, err = evaluate(capsys, tmp_path, scripted.address, "first", "cache-first")
    scripted.server.shutdown()
    assert code == 0, err
    first = json.loads(out.strip().splitlines()[-1])["retrievers"]["hyperprove"]
    calls = len(rows(tmp_path / "first" / "lm_calls.jsonl.gz")) - 1
    assert first["em"] == 100.0 and calls == len(scripted.requests) > 8
    # the embedded model's requests went over HTTP, under its own name
    assert rows(tmp_path / "first" / "lm_calls.jsonl.gz")[1]["request"]["model"] == f"openai/{LOCAL_MODEL_NAME}"

    # The same run against the replay server, another process: the same answers, every call served from the record.
    server = ReplayServer(tmp_path / "first")
    try:
        code, out, err = evaluate(capsys, tmp_path, server.address, "second", "cache-second")
        assert code == 0, err
        second = json.loads(out.strip().splitlines()[-1])["retrievers"]["hyperprove"]
        assert metrics(second) == metrics(first)
        assert server.stats()["served"] == calls and server.stats()["missed"] == 0
    finally:
        server.stop()

    # The endpoint goes away mid-run: after its retries the run stops with one line, and the same
    # command against an endpoint that is back asks only what was not answered before.
    server = ReplayServer(tmp_path / "first", delay=0.2)
    killer = threading.Timer(2.0, server.stop)
    killer.start()
    code, _, err = evaluate(capsys, tmp_path, server.address, "third", "cache-third", "--lm-retries", 1)
    killer.join()
    line = one_line(err[err.rindex("error: "):])  # after the progress bar it cut short
    assert code == 2 and line.startswith("the LM failed (LMTransportError)") and line.endswith("the same command resumes")
    assert not (tmp_path / "third" / "results.json").exists()
    answered = sqlite3.connect(tmp_path / "cache-third" / "lm-responses.sqlite3").execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    assert 0 < answered < calls
    back = ReplayServer(tmp_path / "first")
    try:
        code, out, err = evaluate(capsys, tmp_path, back.address, "third", "cache-third")
        assert code == 0, err
        assert metrics(json.loads(out.strip().splitlines()[-1])["retrievers"]["hyperprove"]) == metrics(first)
        assert back.stats()["served"] == calls - answered  # nothing answered before was asked again
    finally:
        back.stop()
