"""Optuna sweeps of the retriever's alpha, theta, L and K (METHOD.md steps 8-9).

- TPE sampler (seeded), maximising the objective (Recall@5 or F1) on a chosen question set.
- The study lives in an Optuna RDB storage (SQLite under .hyperprove by default, any URL works,
  so several machines can share one study); running the same sweep again continues it up to
  the requested number of finished trials, so an interrupted sweep loses at most the trial in
  flight.
- Each trial evaluates the questions in chunks and reports the running mean after each chunk,
  so the median pruner can stop a poor trial early.
- Tracking (when enabled): one MLflow parent run per invocation, one nested run per trial, and
  the history, importance and parallel-coordinate plots as artifacts of the parent.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Callable, Sequence

from modules.errors import HyperProveError
from pipeline.config import SweepConfig


def suggest(trial, sweep: SweepConfig) -> dict:
    """The retriever parameters of one trial."""
    return {
        "alpha": trial.suggest_float("alpha", *sweep.alpha),
        "theta": trial.suggest_float("theta", *sweep.theta),
        "depth": trial.suggest_int("depth", *sweep.depth),
        "top_k": trial.suggest_int("top_k", *sweep.top_k),
    }


def open_study(sweep: SweepConfig):
    import optuna

    from optimize.tracking import make_sqlite_folder

    make_sqlite_folder(sweep.storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        storage=sweep.storage, study_name=sweep.study, direction="maximize", load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=sweep.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1),
    )


def finished_trials(study) -> int:
    from optuna.trial import TrialState

    return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)


def run_sweep(
    sweep: SweepConfig,
    questions: Sequence,
    score_chunk: Callable[[dict, Sequence], list[float]],
    on_trial: Callable[[object, dict, float | None], None] | None = None,
    progress: bool = True,
):
    """Continue the study until it holds `sweep.trials` finished trials; returns the study.

    `score_chunk(params, questions)` gives one objective value per question (0-1 scale).
    """
    import optuna

    if not questions:
        raise HyperProveError("sweep: no questions to evaluate")
    study = open_study(sweep)
    remaining = sweep.trials - finished_trials(study)

    def objective(trial) -> float:
        params = suggest(trial, sweep)
        scores: list[float] = []
        for step, start in enumerate(range(0, len(questions), sweep.chunk)):
            scores += score_chunk(params, questions[start : start + sweep.chunk])
            trial.report(100 * sum(scores) / len(scores), step)
            if trial.should_prune():
                if on_trial:
                    on_trial(trial, params, None)
                raise optuna.TrialPruned()
        value = 100 * sum(scores) / len(scores)
        if on_trial:
            on_trial(trial, params, value)
        return value

    if remaining > 0:
        study.optimize(objective, n_trials=remaining, show_progress_bar=progress, catch=())
    return study


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
    from optuna.trial import TrialState

    states = [t.state for t in study.trials]
    best = study.best_trial if any(s == TrialState.COMPLETE for s in states) else None
    return {
        "study": study.study_name,
        "trials": len(states),
        "complete": states.count(TrialState.COMPLETE),
        "pruned": states.count(TrialState.PRUNED),
        "best_value": None if best is None or math.isnan(best.value) else round(best.value, 4),
        "best_params": dict(best.params) if best else {},
        "best_trial": best.number if best else None,
    }
