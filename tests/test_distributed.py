"""`evaluate --ray`: the LM systems' questions answered by Ray workers give the run a single
process gives (metrics, answers, recorded calls), spread over the LM endpoints named, and
resume from the shared LM cache.

The workers are separate processes of a Ray instance started here; their LM is a real `dspy.LM`
talking to scripted OpenAI-compatible endpoints on loopback ports, which count what reached them.
"""

import json
import shutil
import sys

import dspy
import pytest

from pipeline.runtime import Runtime
from tests.support import (
    CORPUS,
    MANY,
    QUESTIONS,
    HashEmbedder,
    ScriptedEndpoint,
    metrics,
    one_line,
    rows,
    run,
    two_hop_script,
)

ray = pytest.importorskip("ray", reason='Ray is an optional extra: pip install -e ".[ray]" (make test installs it)')



def scripted_runtime(config):
    """A worker's runtime (and the local run's): the scripted LM at the config's first endpoint
    (a strict replay, which names none, calls no LM)."""
    lm = dspy.LM("openai/scripted", api_base=(config.lm.endpoints or ["http://127.0.0.1:9/v1"])[0], api_key="none", num_retries=0, temperature=0.0, max_tokens=400)
    return Runtime(config, lm=lm, embedder=HashEmbedder())


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": ":".join(p for p in sys.path if p)}})
    yield
    ray.shutdown()


@pytest.fixture
def endpoints():
    both = [ScriptedEndpoint(two_hop_script(final_answer="2017")) for _ in range(2)]
    yield both
    for endpoint in both:
        endpoint.server.shutdown()


def evaluate(capsys, tmp_path, api_base, out, *extra):
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    (tmp_path / "questions.json").write_text(json.dumps(MANY))
    code, stdout, err = run(capsys, "evaluate", "--questions", tmp_path / "questions.json", "--corpus", tmp_path / "corpus.json",
                            "--retriever", "hyperprove,ppr,dense-iterative", "--decomposition", "lm", "--embedder", "test-hash",
                            "--out", tmp_path / out, "--no-track", "--bridge-rewrite", "lm", "--api-base", api_base, "--json", *extra,
                            runtime=scripted_runtime)
    assert code == 0, err
    return json.loads(stdout.strip().splitlines()[-1])




def test_ray_workers_give_the_single_process_run_spread_over_the_endpoints_and_resume(cluster, endpoints, tmp_path, capsys):
    first, second = endpoints
    local = evaluate(capsys, tmp_path, first.address, "local", "--cache-dir", tmp_path / "cache-local")
    asked_locally = len(first.requests)
    on_ray = evaluate(capsys, tmp_path, f"{first.address},{second.address}", "ray", "--cache-dir", tmp_path / "cache-ray",
                      "--ray", "--ray-workers", "2")
    assert {name: metrics(s) for name, s in on_ray["retrievers"].items()} == {name: metrics(s) for name, s in local["retrievers"].items()}
    assert on_ray["retrievers"]["hyperprove"]["em"] == 100.0 and on_ray["retrievers"]["hyperprove"]["n"] == 8
    answered = [[(row["id"], row["answer"], row["passages"]) for row in json.loads((tmp_path / out / "predictions.json").read_text())["hyperprove"]]
                for out in ("local", "ray")]
    assert answered[0] == answered[1]
    # the record: the same requests, asked for the same questions by the same systems
    recorded = [{call["key"]: sorted((a["system"], a["question"], a["step"]) for a in call["asked_by"])
                 for call in rows(tmp_path / out / "lm_calls.jsonl.gz")[1:]} for out in ("local", "ray")]
    assert recorded[0] == recorded[1] and len(recorded[0]) > 8
    # both endpoints answered; together no more requests than the single process sent
    ray_requests = len(first.requests) - asked_locally, len(second.requests)
    assert min(ray_requests) > 0 and sum(ray_requests) >= asked_locally

    # The Ray run reproduces in one process from its record, with no LM.
    code, out, err = run(capsys, "reproduce", tmp_path / "ray", "--no-track", "--json", runtime=scripted_runtime)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["identical"] is True, err

    # Run again (as after a kill): every call comes from the LM cache the workers share.
    asked = len(first.requests) + len(second.requests)
    again = evaluate(capsys, tmp_path, f"{first.address},{second.address}", "again", "--cache-dir", tmp_path / "cache-ray",
                     "--ray", "--ray-workers", "2")
    assert len(first.requests) + len(second.requests) == asked
    assert {n: metrics(s) for n, s in again["retrievers"].items()} == {n: metrics(s) for n, s in on_ray["retrievers"].items()}


def evaluate_on_ray_alone(capsys, tmp_path):
    """`evaluate --ray` (a cluster started here) on the two-hop question, with the scripted LM."""
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
    return run(capsys, "evaluate", "--questions", tmp_path / "questions.json", "--corpus", tmp_path / "corpus.json",
               "--retriever", "hyperprove", "--decomposition", "lm", "--embedder", "test-hash", "--cache-dir", tmp_path / "cache",
               "--out", tmp_path / "out", "--no-track", "--ray", "--api-base", "http://127.0.0.1:9/v1", runtime=scripted_runtime)


def test_without_ray_the_flag_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code, _, err = evaluate_on_ray_alone(capsys, tmp_path)
    assert code == 2 and one_line(err) == '--ray needs Ray, which is not installed; Ray is an optional extra: pip install -e ".[ray]"'


def test_a_ray_node_that_misses_its_start_up_deadline_is_one_line(tmp_path, capsys, monkeypatch):
    """Ray raises a bare Exception when the node it starts is not up in time (its agents slow on a busy machine)."""
    class SlowRay:
        @staticmethod
        def is_initialized():
            return False

        @staticmethod
        def init(**kwargs):
            raise Exception("The current node timed out during startup.")

    monkeypatch.setitem(sys.modules, "ray", SlowRay)
    code, _, err = evaluate_on_ray_alone(capsys, tmp_path)
    last = err.splitlines()[-1]  # after the index's progress: the workers are started once it is built
    assert code == 2 and last.startswith("error: --ray local: Ray did not come up (The current node timed out during startup.); ")
    assert not (tmp_path / "out").exists()


def test_index_on_ray_gives_the_index_one_process_builds_and_resumes_from_the_extraction_cache(cluster, tmp_path, capsys):
    from pipeline.index.store import load_index

    # each passage's facts: its sentences, its title and the names it holds as entities
    script = {row["text"]: {"entities": [row["title"], *[w for w in ("Steven Spielberg", "Leah Adler", "Ohio River") if w in row["text"]]],
                            "facts": [row["text"]]} for row in CORPUS}
    endpoint = ScriptedEndpoint(script)
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))

    def index(out, cache, *extra):
        code, stdout, err = run(capsys, "index", tmp_path / "corpus.json", "--out", tmp_path / out, "--extractor", "lm", "--embedder",
                                "test-hash", "--cache-dir", tmp_path / cache, "--api-base", endpoint.address, "--json", *extra,
                                runtime=scripted_runtime)
        assert code == 0, err
        return json.loads(stdout.strip().splitlines()[-1])

    try:
        local = index("local", "cache-local")
        asked = len(endpoint.requests)
        on_ray = index("ray", "cache-ray", "--ray", "--ray-workers", "2")
        assert len(endpoint.requests) == 2 * asked == 2 * len(CORPUS)  # each passage asked once, by one worker
        built = [load_index(tmp_path / out) for out in ("local", "ray")]
        assert built[0].fact_text == built[1].fact_text and built[0].entity_names == built[1].entity_names
        assert (built[0].fact_entities != built[1].fact_entities).nnz == 0 and (built[0].fact_vectors == built[1].fact_vectors).all()
        assert {k: v for k, v in on_ray["extractor"].items() if k != "lm_seconds"} == \
               {k: v for k, v in local["extractor"].items() if k != "lm_seconds"}
        assert "Leah Adler" in built[1].entity_names and on_ray["extractor"]["extracted"] == len(CORPUS)
        # again on Ray with the same cache: every passage comes from the extraction cache the driver wrote
        again = index("again", "cache-ray", "--ray", "--ray-workers", "2")
        assert len(endpoint.requests) == 2 * asked and again["extractor"]["cached"] == len(CORPUS)
    finally:
        endpoint.server.shutdown()


def test_a_folder_indexed_on_ray_is_the_index_one_process_builds_and_resumes_from_its_checkpoints(cluster, tmp_path, capsys, monkeypatch):
    from pipeline.index.ingest import building_folder
    from tests.test_ingest import manifest_files, write_docs

    write_docs(tmp_path / "docs")
    flags = ["--embedder", "test-hash", "--eta", "0.7", "--batch-files", "2", "--json", "--cache-dir", tmp_path / "cache"]
    assert run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "local", *flags, runtime=scripted_runtime)[0] == 0
    local_parsed = {path.name: path.read_bytes() for path in (tmp_path / "cache" / "documents").rglob("*.json")}
    shutil.rmtree(tmp_path / "cache")
    monkeypatch.setattr("pipeline.index.commands.finish", lambda out: None)  # the checkpoints stay
    code, out, err = run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "ray", *flags, "--ray", "local", "--ray-workers", "2",
                         runtime=scripted_runtime)
    assert code == 0, err
    assert "--ray: 4 batches over 2 workers" in out and manifest_files(tmp_path / "ray") == manifest_files(tmp_path / "local")
    # the files the workers read are kept by the driver, as one process keeps them: an update parses none of them again
    assert {path.name: path.read_bytes() for path in (tmp_path / "cache" / "documents").rglob("*.json")} == local_parsed
    assert len(local_parsed) == 8
    # two checkpoints gone: the next run on Ray does those two only
    for part in sorted(building_folder(tmp_path / "ray").iterdir())[1:3]:
        shutil.rmtree(part)
    code, out, err = run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "ray", *flags, "--ray", "local", runtime=scripted_runtime)
    assert code == 0 and "resuming: 2 of 4 batches" in out and "--ray: 2 batches over" in out
    assert manifest_files(tmp_path / "ray") == manifest_files(tmp_path / "local")


def test_a_ray_worker_killed_mid_batch_is_restarted_and_its_batch_asked_again(cluster, endpoints, tmp_path, capsys):
    import os
    import signal
    import subprocess
    import threading
    import time

    first, _ = endpoints
    killed = []

    def kill_a_worker_after_some_calls():
        deadline = time.monotonic() + 300
        while len(first.requests) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = subprocess.run(["pgrep", "-f", "ray::QuestionWorker"], capture_output=True, text=True).stdout.split()
        if pids:
            os.kill(int(pids[0]), signal.SIGKILL)
            killed.append(int(pids[0]))

    killer = threading.Thread(target=kill_a_worker_after_some_calls)
    killer.start()
    done = evaluate(capsys, tmp_path, first.address, "killed", "--cache-dir", tmp_path / "cache", "--ray", "--ray-workers", "2")
    killer.join()
    assert killed  # a worker died in the middle of the run ...
    hyperprove = done["retrievers"]["hyperprove"]
    assert (hyperprove["n"], hyperprove["em"], hyperprove["errors"]) == (8, 100.0, 0)  # ... and every question was answered
    calls = rows(tmp_path / "killed" / "lm_calls.jsonl.gz")[1:]
    assert {a["question"] for call in calls for a in call["asked_by"] if a["system"] == "hyperprove"} == {q["id"] for q in MANY}
