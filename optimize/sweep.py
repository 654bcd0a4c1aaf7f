"""Optuna sweeps of the retriever's alpha, theta, L and K (METHOD.md steps 8-9).

- TPE sampler (seeded), maximising the objective (Recall@5 or F1) on a chosen question set.
- The study lives in an Optuna RDB storage (SQLite under .hyperprove by default, any URL works,
  so several machines can share one study); running the same sweep again continues it up to
  the requested number of finished trials, so an interrupted sweep loses at most the trial in
  flight.
- Each trial evaluates the questions in chunks and reports the running mean after each chunk,
  so the median pruner can stop a poor trial early; trial 0 of a new study is the configured
  retriever, and ties on the objective are broken by its partner metric.
- Tracking (when enabled): one MLflow parent run per invocation, one nested run per trial, and
  the history, importance and parallel-coordinate plots as artifacts of the parent.
"""

from __future__ import annotations

import math
import statistics
import warnings
from pathlib import Path
from typing import Callable, Sequence

import optuna

from modules.errors import HyperProveError
from pipeline.config import SWEPT, SweepConfig


FLOATS = ("alpha", "theta")


def swept_names(sweep: SweepConfig) -> list[str]:
    """alpha, theta, L and K always; n_seeds and subgraph_bound when the config gives them a range."""
    return [name for name in SWEPT if getattr(sweep, name) is not None]


def suggest(trial, sweep: SweepConfig) -> dict:
    """The retriever parameters of one trial."""
    suggest_value = lambda name: (trial.suggest_float if name in FLOATS else trial.suggest_int)(name, *getattr(sweep, name))  # noqa: E731
    return {name: suggest_value(name) for name in swept_names(sweep)}


def starting_point(sweep: SweepConfig, retriever: dict) -> dict:
    """The configured retriever's values of the swept parameters."""
    return {name: retriever[name] for name in swept_names(sweep)}


class RunningMedianPruner(optuna.pruners.BasePruner):
    """Stop a trial whose running mean at this step is below the median of the complete trials'
    running means at the same step.

    Optuna's MedianPruner compares the trial's *best* value over its steps instead; for a running
    mean that lets one lucky first chunk shield a poor trial (in a 50-trial MuSiQue sweep it
    pruned nothing, not even a trial at Recall@5 65 against a median near 84).
    """

    def __init__(self, n_startup_trials: int = 5, n_warmup_steps: int = 1):
        self.n_startup_trials, self.n_warmup_steps = n_startup_trials, n_warmup_steps

    def prune(self, study, trial) -> bool:
        step = trial.last_step
        if step is None or step < self.n_warmup_steps:
            return False
        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        at_step = [t.intermediate_values[step] for t in complete if step in t.intermediate_values]
        if len(complete) < self.n_startup_trials or not at_step:
            return False
        return trial.intermediate_values[step] < statistics.median(at_step)


def open_study(sweep: SweepConfig):
    from optimize.tracking import make_sqlite_folder

    make_sqlite_folder(sweep.storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        storage=sweep.storage, study_name=sweep.study, direction="maximize", load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=sweep.seed), pruner=RunningMedianPruner(),
    )


def finished_trials(study) -> int:
    return sum(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in study.trials)


TIE_WEIGHT = 0.001  # of the tie-break metric (0-100) in a trial's value: at most 0.1


def trial_scores(sweep: SweepConfig, rows: Sequence[dict]) -> dict[str, float]:
    """Per-question metric rows -> the objective and the tie-break in percent, and the trial's
    value: the objective plus TIE_WEIGHT times the tie-break. On 40 questions Recall@5 moves in
    steps of about 0.2 and most parameter sets tie (24 of 27 complete trials in the committed
    MuSiQue sweep); the
    tie-break (at most 0.1) orders the ties without overriding the objective there, and gives TPE
    something to follow on the plateau."""
    mean = lambda key: 100 * sum(row.get(key, 0.0) for row in rows) / len(rows)  # noqa: E731
    scores = {sweep.objective: mean(sweep.objective)}
    if sweep.tie_break:
        scores[sweep.tie_break] = mean(sweep.tie_break)
    scores["value"] = scores[sweep.objective] + (TIE_WEIGHT * scores[sweep.tie_break] if sweep.tie_break else 0.0)
    return scores


def run_sweep(
    sweep: SweepConfig,
    questions: Sequence,
    score_chunk: Callable[[dict, Sequence], list[dict]],
    on_trial: Callable[[object, dict, dict | None], None] | None = None,
    progress: bool = True,
    start: dict | None = None,
):
    """Continue the study until it holds `sweep.trials` finished trials; returns the study.

    `score_chunk(params, questions)` gives one row of metrics per question (0-1 scale). A new
    study's first trial is `start` (the configured parameters, when given), so the study records
    what the sweep has to beat. Each trial keeps the objective and the tie-break as user attributes.
    """
    if not questions:
        raise HyperProveError("sweep: no questions to evaluate")
    study = open_study(sweep)
    if start and not study.trials:
        study.enqueue_trial(start)
    remaining = sweep.trials - finished_trials(study)

    def objective(trial) -> float:
        params = suggest(trial, sweep)
        rows: list[dict] = []
        for step, first in enumerate(range(0, len(questions), sweep.chunk)):
            rows += score_chunk(params, questions[first : first + sweep.chunk])
            trial.report(trial_scores(sweep, rows)["value"], step)
            if trial.should_prune():
                if on_trial:
                    on_trial(trial, params, None)
                raise optuna.TrialPruned()
        scores = trial_scores(sweep, rows)
        for key, value in scores.items():
            if key != "value":
                trial.set_user_attr(key, round(value, 4))
        if on_trial:
            on_trial(trial, params, scores)
        return scores["value"]

    if remaining > 0:
        study.optimize(objective, n_trials=remaining, show_progress_bar=progress, catch=())
    return study


def compare(sweep: SweepConfig, score_chunk: Callable[[dict, Sequence], list[dict]], start: dict, best: dict, questions: Sequence) -> dict:
    """The configured and the best parameters on one question set: each one's objective and
    tie-break (percent, as a trial computes them) and their paired difference on the objective."""
    rows = {kind: score_chunk(params, questions) for kind, params in (("start", start), ("best", best))}
    scored = {f"{kind}_scores": {key: round(value, 2) for key, value in trial_scores(sweep, kind_rows).items() if key != "value"}
              for kind, kind_rows in rows.items()}
    return {"n_questions": len(rows["start"]), **scored,
            "difference": paired_difference(rows["best"], rows["start"], sweep.objective, seed=sweep.seed)}


def paired_difference(rows: Sequence[dict], baseline: Sequence[dict], metric: str, resamples: int = 10_000, seed: int = 0) -> dict:
    """`rows` minus `baseline` on `metric`, question by question (percent): the mean, a paired
    bootstrap 95% interval, and how many questions went up, down or stayed.

    Why: on 40 questions one gold passage moves Recall@5 by about half a point, so a sweep's best
    trial is partly the luckiest; the interval says whether its margin is more than that noise.
    The verdict is "better" or "worse" only when the interval excludes 0.
    """
    import numpy as np

    if len(rows) != len(baseline) or not rows:
        raise HyperProveError(f"paired difference: {len(rows)} rows against {len(baseline)}; both need the same questions")
    differences = 100 * (np.array([row[metric] for row in rows], dtype=float) - np.array([row[metric] for row in baseline], dtype=float))
    picks = np.random.default_rng(seed).integers(0, len(differences), size=(resamples, len(differences)))
    low, high = np.percentile(differences[picks].mean(axis=1), [2.5, 97.5])
    return {
        "metric": metric,
        "mean": round(float(differences.mean()), 2),
        "interval95": [round(float(low), 2), round(float(high), 2)],
        "up": int((differences > 0).sum()), "down": int((differences < 0).sum()), "same": int((differences == 0).sum()),
        "verdict": "better" if low > 0 else "worse" if high < 0 else "within noise",
    }


def describe_difference(difference: dict) -> str:
    """One line: "recall@5 +0.63 (95% interval -0.42 to +1.88; 2 up, 1 down, 37 same): within noise"."""
    low, high = difference["interval95"]
    return (f"{difference['metric']} {difference['mean']:+.2f} (95% interval {low:+.2f} to {high:+.2f}; {difference['up']} up, "
            f"{difference['down']} down, {difference['same']} same): {difference['verdict']}")


def recorded_scores(trial) -> dict:
    """The objective and tie-break a trial kept as user attributes, in percent to 2 places."""
    return {key: round(value, 2) for key, value in trial.user_attrs.items()}


def trial_scores_of(study, params: dict) -> dict | None:
    """The objective and tie-break of the first complete trial with exactly these parameters."""
    for trial in study.trials:
        if trial.state == optuna.trial.TrialState.COMPLETE and trial.params == params:
            return recorded_scores(trial)
    return None


def best_parameters(study) -> dict:
    try:
        return dict(study.best_params)
    except ValueError:
        raise HyperProveError(f"study {study.study_name!r}: no finished trial yet") from None


def save_plots(study, directory: Path) -> list[Path]:
    """History, parameter importances and parallel coordinates as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (("history", plots.plot_optimization_history), ("importances", plots.plot_param_importances),
                       ("parallel_coordinates", plots.plot_parallel_coordinate)):
        try:
            with warnings.catch_warnings():  # "experimental" notes and small-study remarks, not problems
                warnings.simplefilter("ignore")
                axes = draw(study)
        except (ValueError, RuntimeError, ZeroDivisionError):  # too few finished trials for this plot
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        path = directory / f"{name}.png"
        figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def summary(study) -> dict:
    states = [t.state for t in study.trials]
    best = study.best_trial if any(s == optuna.trial.TrialState.COMPLETE for s in states) else None
    return {
        "study": study.study_name,
        "trials": len(states),
        "complete": states.count(optuna.trial.TrialState.COMPLETE),
        "pruned": states.count(optuna.trial.TrialState.PRUNED),
        "best_value": None if best is None or math.isnan(best.value) else round(best.value, 4),
        "best_scores": recorded_scores(best) if best else {},
        "best_params": dict(best.params) if best else {},
        "best_trial": best.number if best else None,
    }
