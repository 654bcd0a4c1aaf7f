"""MLflow tracking: flat params, metric names, one logged run read back, and the UI serving it."""

import json

import pytest

from experiments.runs.tracking import flat_params, log_evaluation, metric_name
from pipeline.config import HyperProveConfig, TrackingConfig


def test_flat_params_and_metric_names():
    assert flat_params({"retriever": {"alpha": 0.9, "depth": 2}, "evaluation": {"retrievers": ["dense", "ppr"], "limit": None}, "cache_dir": "c"}) == {
        "retriever.alpha": "0.9", "retriever.depth": "2", "evaluation.retrievers": '["dense", "ppr"]', "evaluation.limit": "null", "cache_dir": "c",
    }
    assert metric_name("hyperprove-fixed", "recall@5") == "hyperprove-fixed.recall_at_5"


def test_a_run_holds_config_metrics_and_artifacts(tmp_path):
    from mlflow.tracking import MlflowClient

    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path}/store/mlflow.db", artifacts=str(tmp_path / "artifacts"), experiment="t")
    (tmp_path / "results.md").write_text("| system |\n")
    config = HyperProveConfig().to_dict()
    systems = {"dense": {"system": "dense", "n": 3, "recall@5": 66.67, "em": None}}
    run_id = log_evaluation(tracking, config, systems, {"table": tmp_path / "results.md"}, "toy", {"hyperprove.lm": "dummy"})
    run = MlflowClient(tracking_uri=tracking.uri).get_run(run_id)
    assert run.info.run_name == "toy" and run.data.tags["hyperprove.lm"] == "dummy"
    assert run.data.metrics == {"dense.n": 3.0, "dense.recall_at_5": 66.67}  # None and text are not metrics
    assert run.data.params["retriever.alpha"] == str(config["retriever"]["alpha"])
    assert len(run.data.params) == len(flat_params(config))
    assert (tmp_path / "artifacts").is_dir() and run.info.artifact_uri.startswith((tmp_path / "artifacts").as_uri())
    env = json.loads((tmp_path / "artifacts" / run.info.artifact_uri.split("/artifacts/", 1)[1] / "environment.json").read_text())
    assert "dspy" in env["packages"]


@pytest.mark.slow
def test_the_ui_serves_the_runs_on_a_loopback_port(tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    from pipeline.traces import connect

    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifacts=str(tmp_path / "artifacts"))
    connect(tracking).create_experiment("served-here")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "ui", "--tracking-uri", tracking.uri, "--port", str(port)],
        cwd=Path(__file__).resolve().parents[1], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline, names = time.monotonic() + 120, None
        while names is None and time.monotonic() < deadline:
            assert server.poll() is None, "the UI exited early"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=50", timeout=5) as reply:
                    names = {experiment["name"] for experiment in json.load(reply)["experiments"]}
            except OSError:
                time.sleep(1)
        assert names is not None and "served-here" in names
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_an_index_whose_embeddings_alone_differ_is_told_apart_from_another_index():
    from experiments.runs.reproduce import index_difference

    recorded = {"files": {"facts.jsonl": {"sha256": "a"}, "synonyms.npy": {"sha256": "s"}, "fact_vectors.npy": {"sha256": "v"},
                          "facts.faiss": {"sha256": "f"}, "facts.added.faiss": {"sha256": "g"}}}
    assert index_difference(recorded, recorded) is None
    rounded = {"files": {**recorded["files"], "fact_vectors.npy": {"sha256": "w"}, "facts.faiss": {"sha256": "e"},
                         "facts.added.faiss": {"sha256": "h"}}}
    assert index_difference(recorded, rounded) == "vectors"  # another CPU's float rounding
    assert index_difference(recorded, {"files": {**rounded["files"], "synonyms.npy": {"sha256": "t"}}}) == "index"  # another graph
    assert index_difference(recorded, {"files": {**recorded["files"], "facts.jsonl": {"sha256": "b"}}}) == "index"
    assert index_difference(recorded, {"files": {"facts.jsonl": {"sha256": "a"}}}) == "index"  # files missing
    assert index_difference(recorded, None) == "index" and index_difference(None, None) is None


def test_same_index_and_metric_deltas():
    from experiments.runs.reproduce import metric_deltas, same_index

    saved = {"files": {"facts.jsonl": {"sha256": "a"}}, "counts": {"facts": 3}}
    assert same_index(saved, {"files": {"facts.jsonl": {"sha256": "a"}}, "counts": {"facts": 9}})
    assert not same_index(saved, {"files": {"facts.jsonl": {"sha256": "b"}}})
    in_memory = {"saved": False, "corpus_sha256": "c", "counts": {"facts": 3}, "extractor": {"name": "lm"}, "embedder": {"id": "e"}}
    assert same_index(in_memory, dict(in_memory)) and not same_index(in_memory, {**in_memory, "counts": {"facts": 4}})
    assert same_index(None, None) and not same_index(None, saved)
    recorded = {"ppr": {"system": "ppr", "n": 60, "recall@5": 59.72, "seconds_per_question": 0.02}}
    assert metric_deltas(recorded, {"ppr": {"n": 60, "recall@5": 60.0, "seconds_per_question": 0.5}}) == {"ppr": {"n": 0.0, "recall@5": 0.28}}


def test_a_question_trace_records_its_answer_fallbacks_and_tags(tmp_path):
    from mlflow.tracking import MlflowClient

    from pipeline.runtime import Runtime
    from pipeline.traces import QuestionTraces

    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifacts=str(tmp_path / "artifacts"))
    traces = QuestionTraces(tracking)
    with traces.question("Who directed Jaws?", "dense") as finish:
        finish("Spielberg", ["answer 1: a note", "final answer: another"], {"em": 1.0, "question_id": "q7"})
    assert traces.close() == 1
    client = MlflowClient(tracking_uri=tracking.uri)
    (trace,) = client.search_traces(locations=[client.get_experiment_by_name("hyperprove").experiment_id])
    (root,) = trace.data.spans
    assert (root.name, root.inputs, root.outputs) == ("dense", {"question": "Who directed Jaws?"}, {"answer": "Spielberg"})
    assert [(event.name, event.attributes["note"]) for event in root.events] == [("fallback", "answer 1: a note"), ("fallback", "final answer: another")]
    assert {k: trace.info.tags[k] for k in ("hyperprove.system", "em", "question_id")} == {"hyperprove.system": "dense", "em": "1.0", "question_id": "q7"}
    # with tracking or traces off, a question runs in a context that records nothing
    for off in ({"tracking": {"enabled": False}}, {"tracking": {"traces": False}}):
        runtime = Runtime(HyperProveConfig.from_dict(off))
        with runtime.question_trace("Who?") as finish:
            finish("x")
        assert runtime.traces is None and not runtime.traces_started
