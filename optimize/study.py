"""The Optuna study behind a sweep of the retriever's alpha, theta, L and K (METHOD.md steps 8-9).

- TPE, maximising the objective (Recall@5 or F1) on a chosen question set. The study lives in an
  Optuna RDB storage (SQLite under .hyperprove by default; any URL, so several machines can share
  one), and running the same sweep again continues it up to the requested number of finished trials.
- The study records what it optimises when it is created (objective, ranges, seed, the data's
  checksums, the fixed settings) and refuses a run with a different setting, which would
  otherwise mix two experiments and report the wrong best.
- Trial seeds come from the trial's place in the study: a trial samples with `seed + draw`,
  where draw counts the trials before it that drew parameters of their own (`draw`). So two
  workers on one study never draw the same parameters, and a worker resumed after a kill asks
  what an uninterrupted one would have asked.
- Workers stop at `trials` finished trials in total: a trial that finds that many finished or
  running trials ahead of it is surplus, marked failed, and ends its worker.
- A trial interrupted by Ctrl-C or a kill is failed, and the parameters it had drawn are asked
  again next, by this run or another worker (one killed while drawing them draws the rest then).
  Running trials of a process that no longer exists on this machine are failed when a run or a
  trial starts; those of other machines when their Optuna heartbeat stops.
- Workers started together on a new storage race to create its tables; the losers open it again.
- Each trial scores the questions in chunks and reports the running mean after each chunk, so
  the pruner can stop a poor trial early; trial 0 of a new study is the configured retriever, and
  ties on the objective are broken by its partner metric.
"""

from __future__ import annotations

import io
import json
import math
import os
import socket
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import optuna
from optuna.trial import TrialState
from optuna.visualization import matplotlib as plots

from modules.config import tunable_type
from modules.errors import HyperProveError, first_line
from pipeline.config import SweepConfig
from pipeline.files import atomic_write_bytes, process_alive
from pipeline.traces import make_sqlite_folder

HEARTBEAT_SECONDS = 30  # a running trial writes a heartbeat this often ...
GRACE_SECONDS = 90  # ... and is failed as stale when its last one is older than this
SETTING = "hyperprove.setting"  # study attribute: what the study optimises
RETRIED = "hyperprove.retried"  # study attribute: failed trials whose parameters were asked again
WORKER = "hyperprove.worker"  # trial attribute: the host and process that ran it
SURPLUS = "hyperprove.surplus"  # trial attribute: started after the study was full, or asked what another trial asks
AGAIN = "hyperprove.asked_again"  # trial attribute: the failed trial whose parameters this one asks again
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
TIE_WEIGHT = 0.001  # of the tie-break metric (0-100) in a trial's value: at most 0.1


class Surplus(Exception):
    """This trial would take the study past its number of trials."""


class AskedTwice(Exception):
    """This trial's fixed parameters are another's (two workers starting at once both enqueued them)."""


def suggest(trial, sweep: SweepConfig) -> dict:
    """The retriever parameters of one trial."""
    return {name: (trial.suggest_float if tunable_type(name) is float else trial.suggest_int)(name, *low_high)
            for name, low_high in sweep.ranges.items()}


def starting_point(sweep: SweepConfig, retriever: dict) -> dict:
    """The configured retriever's values of the swept parameters."""
    return {name: retriever[name] for name in sweep.ranges}


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
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        at_step = [t.intermediate_values[step] for t in complete if step in t.intermediate_values]
        if len(complete) < self.n_startup_trials or not at_step:
            return False
        return trial.intermediate_values[step] < statistics.median(at_step)


def rdb_storage(url: str, tries: int = 6, **options) -> optuna.storages.RDBStorage:
    """Optuna's storage at `url`, its tables created if new. Workers started together on a new
    database race to create them: PostgreSQL's CREATE TABLE IF NOT EXISTS is not atomic (all but one
    worker failed on a unique violation in 10 of 10 rounds of four started at once), and SQLite's
    "table ... already exists" lost 4 of 10 rounds. The tables exist by then, so a worker that lost
    the race opens the storage again."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    for attempt in range(1, tries):
        try:
            return optuna.storages.RDBStorage(url, **options)
        except (IntegrityError, ProgrammingError, OperationalError) as error:
            if isinstance(error, OperationalError) and "already exists" not in str(error):
                raise  # an unreachable server or a file that cannot be opened: no race to wait out
            time.sleep(0.1 * attempt)
    return optuna.storages.RDBStorage(url, **options)  # the last try's error is the user's


def open_study(sweep: SweepConfig, setting: dict | None = None):
    """The study named in `sweep`, created if new; with `setting`, checked to optimise that."""
    make_sqlite_folder(sweep.storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna's words
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # a trial whose heartbeat stopped (its worker died on another machine) is failed by
            # whichever worker notices first, and only that one asks it again
            storage = rdb_storage(sweep.storage, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=GRACE_SECONDS,
                                  heartbeat_stale_trial_callback=lambda study, trial: ask_again(study, [trial.number]))
        study = optuna.create_study(storage=storage, study_name=sweep.study, direction="maximize", load_if_exists=True,
                                    sampler=optuna.samplers.TPESampler(seed=sweep.seed), pruner=RunningMedianPruner())
    except Exception as error:  # noqa: BLE001 - a bad URL or an unreachable store is one line for the user
        raise HyperProveError(f"--storage {sweep.storage}: Optuna cannot open it ({type(error).__name__}: {first_line(error)})") from None
    if setting is not None:
        check_setting(study, sweep, setting)
    return study


def check_setting(study, sweep: SweepConfig, setting: dict) -> None:
    """Record `setting` in a new study; refuse one that was made for another."""
    setting = json.loads(json.dumps(setting))  # as the storage gives it back
    recorded = study.user_attrs.get(SETTING)
    where = f"study {sweep.study!r} in {sweep.storage}"
    if recorded is None:
        if study.trials:
            raise HyperProveError(f"{where} has trials but no record of what it optimises (made by an older HyperProve); "
                                  "give --study a new name")
        study.set_user_attr(SETTING, setting)
        return
    for key in sorted(set(recorded) | set(setting)):
        if recorded.get(key) != setting.get(key):
            raise HyperProveError(f"{where} was made with {key} = {json.dumps(recorded.get(key))}, this sweep has "
                                  f"{json.dumps(setting.get(key))}; give --study a new name, or run it with the study's setting")


def finished_trials(study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def place(study, trial) -> int:
    """How many trials before this one did not fail (finished, running or waiting to run)."""
    ahead = study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING, TrialState.WAITING))
    return sum(t.number < trial.number for t in ahead)


def asked_before(study, trial) -> int | None:
    """The earlier trial (waiting, running or finished) whose parameters this enqueued trial fixes, if any."""
    trials = study.get_trials(deepcopy=False)
    fixed = next(t for t in trials if t.number == trial.number).system_attrs.get("fixed_params")
    if not fixed:
        return None
    return next((other.number for other in trials if other.number < trial.number and other.state in (*FINISHED, TrialState.RUNNING, TrialState.WAITING)
                 and other.system_attrs.get("fixed_params", other.params) == fixed), None)


def draw(study, trial) -> int:
    """The trial's seed offset: how many trials before it drew parameters of their own (all but the
    surplus ones, the failed trials asked again, and copies of an enqueued trial). A failed trial
    keeps its draw and its re-ask takes none, so two workers never draw with one seed (whatever fails
    meanwhile), and a sweep resumed after a kill draws what an uninterrupted one would have. A copy
    (two workers enqueued the starting parameters at once) is left out from its creation, not from
    when its worker marks it surplus: a trial that counted it until then would share a seed."""
    enqueued, offset = set(), 0
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if t.number >= trial.number:
            break
        fixed = json.dumps(t.system_attrs["fixed_params"], sort_keys=True) if "fixed_params" in t.system_attrs else None
        copy = fixed is not None and fixed in enqueued
        enqueued.add(fixed)
        offset += not copy and AGAIN not in t.user_attrs and not t.user_attrs.get(SURPLUS)
    return offset


def fail_abandoned(study) -> list[int]:
    """Fail the running trials of processes on this machine that no longer exist (a kill leaves
    them running forever otherwise); returns their numbers."""
    host, failed = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get(WORKER) or {}
        if worker.get("host") == host and not process_alive(worker.get("pid", -1)):
            try:
                study.tell(trial.number, state=TrialState.FAIL)
                failed.append(trial.number)
            except (ValueError, RuntimeError):  # another worker got there first
                continue
    return failed


def ask_again_interrupted(study) -> list[int]:
    """Ask again the parameters of every failed trial not yet asked again (surplus trials aside),
    so that an interrupted sweep repeats the trial it lost; returns their numbers."""
    retried = set(study.user_attrs.get(RETRIED, []))
    return ask_again(study, [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                             if t.number not in retried and not t.user_attrs.get(SURPLUS) and asked(t)])


def asked(trial) -> dict:
    """The parameters a trial ran with, or was to run with (an enqueued trial killed before it began)."""
    return dict(trial.params or trial.system_attrs.get("fixed_params") or {})


def ask_again(study, numbers: Sequence[int]) -> list[int]:
    """Enqueue the parameters of these failed trials, each unless a waiting, running or finished
    trial already holds them (another worker asked it again first); returns those enqueued."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    held = {json.dumps(t.system_attrs.get("fixed_params", t.params), sort_keys=True)
            for t in trials.values() if t.state in (*FINISHED, TrialState.RUNNING, TrialState.WAITING)}
    again = []
    for number in numbers:
        params = asked(trials[number])
        if params and (key := json.dumps(params, sort_keys=True)) not in held:
            study.enqueue_trial(params, user_attrs={AGAIN: number})
            held.add(key)
            again.append(number)
    if again:
        study.set_user_attr(RETRIED, sorted(set(study.user_attrs.get(RETRIED, [])) | set(again)))
    return again


def trial_scores(sweep: SweepConfig, rows: Sequence[dict]) -> dict[str, float]:
    """Per-question metric rows -> the objective and the tie-break in percent, and the trial's
    value: the objective plus TIE_WEIGHT times the tie-break. On 40 questions Recall@5 moves in
    steps of about 0.2 and most parameter sets tie; the tie-break (at most 0.1) orders the ties without overriding the objective
    there, and gives TPE something to follow on the plateau."""
    mean = lambda key: 100 * sum(row.get(key, 0.0) for row in rows) / len(rows)  # noqa: E731
    scores = {sweep.objective: mean(sweep.objective)}
    if sweep.tie_break:
        scores[sweep.tie_break] = mean(sweep.tie_break)
    scores["value"] = scores[sweep.objective] + (TIE_WEIGHT * scores[sweep.tie_break] if sweep.tie_break else 0.0)
    return scores


def run_trials(
    sweep: SweepConfig,
    questions: Sequence,
    score_chunk: Callable[[dict, Sequence], list[dict]],
    on_trial: Callable[[object, dict, dict | None], None] | None = None,
    progress: bool = True,
    start: dict | None = None,
    setting: dict | None = None,
):
    """Continue the study until it holds `sweep.trials` finished trials; returns the study.

    `score_chunk(params, questions)` gives one row of metrics per question (0-1 scale). A new
    study's first trial is `start` (the configured parameters, when given), so the study records
    what the sweep has to beat. Each trial keeps the objective and the tie-break as user attributes.
    """
    if not questions:
        raise HyperProveError("sweep: no questions to evaluate")
    study = open_study(sweep, setting)
    fail_abandoned(study)
    if start and not study.trials:
        study.enqueue_trial(start, skip_if_exists=True)
    if finished_trials(study) < sweep.trials:
        ask_again_interrupted(study)

    def objective(trial) -> float:
        trial.set_user_attr(WORKER, {"host": socket.gethostname(), "pid": os.getpid()})
        ask_again(study, fail_abandoned(study))  # a worker killed meanwhile: its trial fails now and is asked again next
        if (twin := asked_before(study, trial)) is not None:
            trial.set_user_attr(SURPLUS, True)
            raise AskedTwice(f"trial {twin} holds the same parameters")
        ahead = place(study, trial)
        if ahead >= sweep.trials:
            trial.set_user_attr(SURPLUS, True)
            full.append(trial.number)
            study.stop()
            raise Surplus(f"the study already holds {ahead} finished or running trials")
        study.sampler = optuna.samplers.TPESampler(seed=sweep.seed + draw(study, trial))  # sampling happens at suggest time
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

    def stop_when_full(study, trial) -> None:
        if finished_trials(study) >= sweep.trials:
            study.stop()

    full: list[int] = []  # a surplus trial: the others fill the study
    while (left := sweep.trials - finished_trials(study)) > 0 and not full:  # again after a skipped copy took a turn
        study.optimize(objective, n_trials=left, show_progress_bar=progress, catch=(Surplus, AskedTwice), callbacks=[stop_when_full])
    return study


def recorded_scores(trial) -> dict:
    """The objective and tie-break a trial kept as user attributes, in percent to 2 places."""
    return {key: round(value, 2) for key, value in trial.user_attrs.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}


def trial_scores_of(study, params: dict) -> dict | None:
    """The objective and tie-break of the first complete trial with exactly these parameters."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if trial.params == params:
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
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        plt.close(figure)
        path = directory / f"{name}.png"
        atomic_write_bytes(path, buffer.getvalue())
        written.append(path)
    return written


def summary(study) -> dict:
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = study.best_trial if complete else None
    return {
        "study": study.study_name,
        "trials": sum(t.state in FINISHED for t in trials),
        "failed": sum(t.state == TrialState.FAIL for t in trials),
        "complete": len(complete),
        "pruned": sum(t.state == TrialState.PRUNED for t in trials),
        "best_value": None if best is None or math.isnan(best.value) else round(best.value, 4),
        "best_scores": recorded_scores(best) if best else {},
        "best_params": dict(best.params) if best else {},
        "best_trial": best.number if best else None,
    }
