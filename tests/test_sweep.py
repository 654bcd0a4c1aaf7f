"""Optuna sweeps: continuing an interrupted study, pruning on partial scores, the CLI with MLflow."""

import json
import statistics

import pytest

from experiments.stats import paired_difference
from modules.errors import HyperProveError
from optimize.study import TIE_WEIGHT, finished_trials, open_study, run_trials, summary, trial_scores
from pipeline.config import SweepConfig

QUESTIONS = list(range(6))


def alpha_score(params, chunk):
    """A known objective: every question's Recall@5 is 1 - (alpha - 0.7)^2 (Recall@2 is 0)."""
    return [{"recall@5": 1.0 - (params["alpha"] - 0.7) ** 2} for _ in chunk]


def test_an_interrupted_sweep_continues_the_same_study(tmp_path):
    sweep = SweepConfig(trials=5, storage=f"sqlite:///{tmp_path}/optuna.db", study="s", chunk=3)
    calls = []

    def interrupted(params, chunk):
        calls.append(params)
        if len(calls) == 5:  # the first chunk of the third trial
            raise KeyboardInterrupt
        return alpha_score(params, chunk)

    with pytest.raises(KeyboardInterrupt):
        run_trials(sweep, QUESTIONS, interrupted, progress=False)
    assert finished_trials(open_study(sweep)) == 2
    study = run_trials(sweep, QUESTIONS, alpha_score, progress=False)
    assert finished_trials(study) == 5 and len(study.trials) == 6  # the interrupted trial stays, failed
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4, 5]
    # the first two trials were not redone: their parameters are the ones scored before the interruption
    assert [t.params["alpha"] for t in study.trials[:2]] == [calls[0]["alpha"], calls[2]["alpha"]]
    best = summary(study)
    assert best["complete"] == 5 and best["best_value"] == pytest.approx(100 * (1 - (best["best_params"]["alpha"] - 0.7) ** 2), abs=1e-3)
    assert run_trials(sweep, QUESTIONS, alpha_score, progress=False).trials[-1].number == 5  # nothing left to do


def test_pruned_trials_were_below_the_median_at_their_last_step(tmp_path):
    sweep = SweepConfig(trials=14, storage=f"sqlite:///{tmp_path}/optuna.db", study="p", chunk=2)
    study = run_trials(sweep, QUESTIONS, lambda params, chunk: [{"recall@5": params["alpha"]}] * len(chunk), progress=False)
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
    with pytest.raises(HyperProveError, match="transfer_questions and transfer_corpus go together"):
        SweepConfig(transfer_questions="dev.json")


def test_the_sweep_command_tracks_trials_and_writes_the_best_config(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from pipeline.cli import main
    from pipeline.runtime import Runtime
    from tests.support import CORPUS, QUESTIONS, HashEmbedder

    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = ["sweep", "--questions", tmp_path / "questions.json", "--corpus", tmp_path / "corpus.json", "--embedder", "test-hash",
            "--trials", "3", "--storage", f"sqlite:///{tmp_path}/optuna.db", "--study", "toy", "--cache-dir", tmp_path / "cache",
            "--best-out", tmp_path / "best.json", "--tracking-uri", uri, "--validate", tmp_path / "questions.json",
            "--out", tmp_path / "sweep", "--transfer-questions", tmp_path / "questions.json",
            "--transfer-corpus", tmp_path / "other", "--json"]  # a folder, here holding a corpus file
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "corpus.json").write_text(json.dumps(CORPUS))
    assert main([str(a) for a in argv], make_runtime=lambda config: Runtime(config, embedder=HashEmbedder())) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["complete"] + result["pruned"] == 3 and result["trials"] == 3
    # trial 0 is the configured retriever; scored again on the held-out set (here the same questions)
    # both parameter sets give the values their trials gave
    assert result["start_params"] == {"alpha": 0.9, "theta": 0.05, "depth": 2, "top_k": 3}
    validation = result["validation"]
    assert validation["start_scores"] == result["start_scores"] and validation["best_scores"] == result["best_scores"]
    # the paired difference is best minus configured, over the same questions either way
    difference = result["difference"]
    assert validation["difference"] == difference and difference["metric"] == "recall@5"
    # the transfer check reads and indexes its own corpus (here a folder with a copy, so it scores what the sweep's questions did)
    transfer = result["transfer"]
    assert transfer["corpus"] == str(tmp_path / "other") and transfer["n_questions"] == len(QUESTIONS)
    assert (transfer["start_scores"], transfer["best_scores"], transfer["difference"]) == (result["start_scores"], result["best_scores"], difference)
    assert difference["up"] + difference["down"] + difference["same"] == len(QUESTIONS)
    assert difference["mean"] == pytest.approx(result["best_scores"]["recall@5"] - result["start_scores"]["recall@5"], abs=0.011)
    assert set(result["best_scores"]) == {"recall@5", "recall@2"}
    recorded = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert recorded["mlflow_run"] == result["mlflow_run"] and recorded["config"]["sweep"]["trials"] == 3
    best = json.loads((tmp_path / "best.json").read_text())
    assert {k: best["retriever"][k] for k in result["best_params"]} == result["best_params"]
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(result["mlflow_run"])
    assert parent.data.tags["hyperprove.kind"] == "sweep" and parent.data.metrics["best.recall_at_5"] == result["best_scores"]["recall@5"]
    assert parent.data.metrics["transfer_start.recall_at_5"] == result["start_scores"]["recall@5"]
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(run.info.run_name for run in children) == ["trial-0", "trial-1", "trial-2"]
    assert client.search_runs([parent.info.experiment_id], "attributes.run_name = 'trial-0'")[0].data.params == {
        "alpha": "0.9", "theta": "0.05", "depth": "2", "top_k": "3"}
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"best.json", "sweep.json", "history.png", "parallel_coordinates.png"}


def test_n_seeds_and_subgraph_bound_are_swept_only_when_given_a_range(tmp_path):
    seen = []

    def record(params, chunk):
        seen.append(params)
        return alpha_score(params, chunk)

    run_trials(SweepConfig(trials=3, storage=f"sqlite:///{tmp_path}/a.db", n_seeds=[5, 40]), QUESTIONS, record, progress=False)
    assert {tuple(sorted(p)) for p in seen} == {("alpha", "depth", "n_seeds", "theta", "top_k")}
    assert all(5 <= p["n_seeds"] <= 40 and 1 <= p["depth"] <= 4 and 2 <= p["top_k"] <= 12 for p in seen)
    seen.clear()
    run_trials(SweepConfig(trials=2, storage=f"sqlite:///{tmp_path}/b.db"), QUESTIONS, record, progress=False)
    assert {tuple(sorted(p)) for p in seen} == {("alpha", "depth", "theta", "top_k")}
    with pytest.raises(HyperProveError, match=r"subgraph_bound=\[900, 300\] must be \[low, high\]"):
        SweepConfig(subgraph_bound=[900, 300])


def test_ties_on_the_objective_are_ordered_by_the_partner_metric(tmp_path):
    rows = [{"recall@5": 1.0, "recall@2": 0.5}, {"recall@5": 0.5, "recall@2": 0.0}]
    assert trial_scores(SweepConfig(), rows) == {"recall@5": 75.0, "recall@2": 25.0, "value": 75.0 + 25.0 * TIE_WEIGHT}
    assert trial_scores(SweepConfig(break_ties=False), rows) == {"recall@5": 75.0, "value": 75.0}
    assert SweepConfig(objective="f1").tie_break == "em"
    # Recall@5 is flat; Recall@2 grows with alpha: the best trial is the one with the largest alpha.
    plateau = lambda params, chunk: [{"recall@5": 0.8, "recall@2": params["alpha"]} for _ in chunk]  # noqa: E731
    study = run_trials(SweepConfig(trials=8, storage=f"sqlite:///{tmp_path}/t.db"), QUESTIONS, plateau, progress=False)
    best = summary(study)
    assert best["best_params"]["alpha"] == max(t.params["alpha"] for t in study.trials)
    assert best["best_scores"] == {"recall@5": 80.0, "recall@2": round(100 * best["best_params"]["alpha"], 2)}


def test_the_pruner_judges_the_running_mean_at_this_step_not_the_best_so_far():
    import optuna

    from optimize.study import RunningMedianPruner

    study = optuna.create_study(direction="maximize")
    for value in (80.0, 82.0, 84.0, 86.0, 88.0):  # five complete trials; median 84 at every step
        study.add_trial(optuna.trial.create_trial(value=value, params={}, distributions={}, intermediate_values={0: value, 1: value}))
    lucky_start = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, intermediate_values={0: 95.0, 1: 70.0})
    steady = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, intermediate_values={0: 83.0, 1: 85.0})
    assert RunningMedianPruner().prune(study, lucky_start) is True  # 70 < 84 at step 1
    assert not optuna.pruners.MedianPruner(n_warmup_steps=1).prune(study, lucky_start)  # its best, 95, hides it
    assert RunningMedianPruner().prune(study, steady) is False
    assert RunningMedianPruner(n_startup_trials=6).prune(study, lucky_start) is False  # too few complete trials yet


def test_the_paired_difference_worked_by_hand():
    rows = lambda *values: [{"recall@5": v} for v in values]  # noqa: E731
    # differences 0, +50, 0, +50: mean +25. A resample of four is all zeros (or all +50) with
    # chance 1/16 > 2.5%, so the 95% interval is [0, 50] and includes 0.
    difference = paired_difference(rows(1.0, 0.5, 0.0, 1.0), rows(1.0, 0.0, 0.0, 0.5), "recall@5")
    assert difference == {"metric": "recall@5", "mean": 25.0, "interval95": [0.0, 50.0], "up": 2, "down": 0, "same": 2,
                          "verdict": "within noise"}
    # the same gain on every question: no resample can undo it
    assert paired_difference(rows(0.5, 1.0, 0.5), rows(0.0, 0.5, 0.0), "recall@5")["interval95"] == [50.0, 50.0]
    assert paired_difference(rows(0.5, 1.0, 0.5), rows(0.0, 0.5, 0.0), "recall@5")["verdict"] == "better"
    assert paired_difference(rows(0.0, 0.5), rows(0.5, 1.0), "recall@5")["verdict"] == "worse"
    with pytest.raises(HyperProveError, match="3 rows against 2"):
        paired_difference(rows(1, 1, 1), rows(1, 1), "recall@5")


def test_parameters_two_workers_enqueued_at_once_are_run_once(tmp_path):
    """Workers that start together on a new study each enqueue the configured parameters; the
    later copy is skipped (not counted, not drawn from), so the study still ends with exactly its
    trials, each parameter set once."""
    sweep = SweepConfig(trials=4, storage=f"sqlite:///{tmp_path}/optuna.db", study="twice", chunk=3)
    start = {"alpha": 0.5, "theta": 0.1, "depth": 2, "top_k": 3}
    study = open_study(sweep)
    study.enqueue_trial(start)
    study.enqueue_trial(start)  # the second worker's copy
    study = run_trials(sweep, QUESTIONS, alpha_score, progress=False, start=start)
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 4 and len({json.dumps(t.params, sort_keys=True) for t in finished}) == 4
    skipped = [t for t in study.trials if t.state.name == "FAIL"]
    assert [t.number for t in skipped] == [1] and skipped[0].user_attrs["hyperprove.surplus"] is True
