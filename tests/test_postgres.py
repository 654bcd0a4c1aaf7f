"""Studies on a real PostgreSQL server: sweep workers as separate processes share one Optuna study,
one is killed in the middle of a trial and another takes its trial up, and the study ends with
exactly the trials asked for, no parameter set twice; and an MLflow tracking server backed by the
same server tracks evaluate runs that `reproduce` reruns from their id.

The server is `experiments.bench.postgres.LocalPostgres` (the Debian package's binaries, in a
temporary folder); without the binaries or the driver, the tests say why they skip.
"""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

from experiments.bench.postgres import LocalPostgres, missing
from optimize.study import AGAIN
from pipeline.config import SweepConfig

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"PostgreSQL: {missing()}")

QUESTIONS = list(range(4))


def sweep_worker(url: str, trials: int, seconds_per_chunk: float) -> None:
    """One sweep worker (a process of its own): trials whose score is alpha, each taking a while."""
    from optimize.study import run_trials

    def score(params, chunk):
        time.sleep(seconds_per_chunk)
        return [{"recall@5": params["alpha"], "recall@2": params["alpha"]} for _ in chunk]

    run_trials(SweepConfig(storage=url, study="pg", trials=trials, chunk=2), QUESTIONS, score, progress=False)


@pytest.fixture(scope="module")
def server():
    with LocalPostgres() as running:
        yield running


def test_sweep_workers_share_a_study_and_take_up_a_killed_workers_trial(server):
    url = server.create("studies")
    spawn = multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=sweep_worker, args=(url, 8, 0.4)) for _ in range(3)]
    for worker in workers:
        worker.start()
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and time.monotonic() < deadline:
        names = optuna.get_all_study_names(storage=url)
        running = optuna.load_study(study_name="pg", storage=url).get_trials(states=(optuna.trial.TrialState.RUNNING,)) if names else []
        victim = next((t for t in running if (t.user_attrs.get("hyperprove.worker") or {}).get("pid") == workers[0].pid), None)
        if victim is not None and victim.params:
            os.kill(workers[0].pid, signal.SIGKILL)
            killed = victim
        time.sleep(0.05)
    for worker in workers:
        worker.join(120)
    assert killed is not None and workers[0].exitcode == -signal.SIGKILL and [w.exitcode for w in workers[1:]] == [0, 0]

    trials = optuna.load_study(study_name="pg", storage=url).get_trials()
    finished = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(finished) == 8  # exactly the trials asked for, all workers together
    assert len({json.dumps(t.params, sort_keys=True) for t in finished}) == 8  # no parameter set twice
    lost = next(t for t in trials if t.number == killed.number)
    assert lost.state == optuna.trial.TrialState.FAIL
    again = [t for t in finished if t.user_attrs.get(AGAIN) == lost.number]  # taken up by another worker ...
    assert len(again) == 1 and lost.params.items() <= again[0].params.items()  # ... with what the lost trial had drawn


def test_runs_tracked_by_an_mlflow_server_on_postgresql_reproduce_from_their_id(server, tmp_path, capsys):
    from experiments.bench.postgres import free_port, wait_for_mlflow
    from tests.support import CORPUS, QUESTIONS, run

    port = free_port()
    mlflow = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", server.create("runs"),
                               "--default-artifact-root", (tmp_path / "artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        uri = f"http://127.0.0.1:{port}"
        wait_for_mlflow(uri)
        (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
        (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
        code, out, err = run(capsys, "evaluate", "--questions", tmp_path / "questions.json", "--corpus", tmp_path / "corpus.json",
                             "--retriever", "dense,hyperprove", "--embedder", "test-hash", "--cache-dir", tmp_path / "cache",
                             "--out", tmp_path / "run", "--tracking-uri", uri, "--json")
        assert code == 0, err
        run_id = json.loads(out.strip().splitlines()[-1])["mlflow_run"]
        assert run_id and len(run_id) == 32
        code, out, err = run(capsys, "reproduce", run_id, "--tracking-uri", uri, "--cache-dir", tmp_path / "cache",
                             "--out", tmp_path / "again", "--json")
        assert code == 0 and json.loads(out.strip().splitlines()[-1])["identical"] is True, err
    finally:
        os.killpg(mlflow.pid, signal.SIGTERM)
        mlflow.wait(30)
