"""Optuna sweeps: continuing an interrupted study, pruning on partial scores, the CLI with MLflow."""

import json
import statistics

import pytest

from modules.errors import HyperProveError
from optimize.sweep import finished_trials, open_study, run_sweep, summary
from pipeline.config import SweepConfig

QUESTIONS = list(range(6))


def alpha_score(params, chunk):
    """A known objective: every question scores 1 - (alpha - 0.7)^2."""
    return [1.0 - (params["alpha"] - 0.7) ** 2 for _ in chunk]


def test_an_interrupted_sweep_continues_the_same_study(tmp_path):
    sweep = SweepConfig(trials=5, storage=f"sqlite:///{tmp_path}/optuna.db", study="s", chunk=3)
    calls = []

    def interrupted(params, chunk):
        calls.append(params)
        if len(calls) == 5:  # the first chunk of the third trial
            raise KeyboardInterrupt
        return alpha_score(params, chunk)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, QUESTIONS, interrupted, progress=False)
    assert finished_trials(open_study(sweep)) == 2
    study = run_sweep(sweep, QUESTIONS, alpha_score, progress=False)
    assert finished_trials(study) == 5 and len(study.trials) == 6  # the interrupted trial stays, failed
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4, 5]
    # the first two trials were not redone: their parameters are the ones scored before the interruption
    assert [t.params["alpha"] for t in study.trials[:2]] == [calls[0]["alpha"], calls[2]["alpha"]]
    best = summary(study)
    assert best["complete"] == 5 and best["best_value"] == pytest.approx(100 * (1 - (best["best_params"]["alpha"] - 0.7) ** 2), abs=1e-3)
    assert run_sweep(sweep, QUESTIONS, alpha_score, progress=False).trials[-1].number == 5  # nothing left to do


def test_pruned_trials_were_below_the_median_at_their_last_step(tmp_path):
    sweep = SweepConfig(trials=14, storage=f"sqlite:///{tmp_path}/optuna.db", study="p", chunk=2)
    study = run_sweep(sweep, QUESTIONS, lambda params, chunk: [params["alpha"]] * len(chunk), progress=False)
    from optuna.trial import TrialState

    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned, "with a score that is alpha itself, low-alpha trials after the first five are pruned"
    for trial in pruned:
        step = max(trial.intermediate_values)
        earlier = [t.intermediate_values[step] for t in study.trials[: trial.number]
                   if t.state == TrialState.COMPLETE and step in t.intermediate_values]
        assert trial.intermediate_values[step] < statistics.median(earlier)


def test_bad_sweep_config_is_named():
    with pytest.raises(HyperProveError, match="objective='ndcg' must be one of"):
        SweepConfig(objective="ndcg")
    with pytest.raises(HyperProveError, match=r"theta=\[0.5, 0.1\] must be \[low, high\]"):
        SweepConfig(theta=[0.5, 0.1])


def test_the_sweep_command_tracks_trials_and_writes_the_best_config(tmp_path, capsys, monkeypatch):
    import pipeline.cli as cli
    from mlflow.tracking import MlflowClient

    from tests.conftest import HashEmbedder
    from tests.test_cli import CORPUS, QUESTIONS

    monkeypatch.setattr(cli, "_embedder", lambda config: HashEmbedder())
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = ["sweep", "--questions", tmp_path / "questions.json", "--corpus", tmp_path / "corpus.json", "--embedder", "test-hash",
            "--trials", "3", "--storage", f"sqlite:///{tmp_path}/optuna.db", "--study", "toy", "--cache-dir", tmp_path / "cache",
            "--best-out", tmp_path / "best.json", "--tracking-uri", uri, "--json"]
    assert cli.main([str(a) for a in argv]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["complete"] + result["pruned"] == 3 and result["trials"] == 3
    best = json.loads((tmp_path / "best.json").read_text())
    assert {k: best["retriever"][k] for k in result["best_params"]} == result["best_params"]
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(result["mlflow_run"])
    assert parent.data.tags["hyperprove.kind"] == "sweep" and parent.data.metrics["best_recall_at_5"] == result["best_value"]
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(run.info.run_name for run in children) == ["trial-0", "trial-1", "trial-2"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"best.json", "history.png", "parallel_coordinates.png"}
