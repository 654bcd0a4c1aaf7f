"""The benchmark report, generated from the results the evaluate runs wrote (never typed by hand).

    python -m experiments.runs.report            # reads experiments/results/*/results.json
                                            # writes experiments/REPORT.md

Each run directory comes from `hyperprove evaluate --config experiments/configs/<name>.json`; the
report lists them (retrieval-only settings first), each with its command, commit, MLflow run,
the table, and a line comparing HyperProve's Recall@5 with the best baseline's; a run with a
compiled program is compared with the same setting uncompiled, also question by question. Sweeps
(`*/sweep.json`, from `hyperprove sweep --config ...`) follow: the configured and the best
parameters, scored on the sweep's questions and on its held-out set, with their paired difference
(a bootstrap interval says whether the best trial's margin is more than noise).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]

from experiments.harness import SYSTEMS, TYPE_SCORES, per_type_tables, results_table, with_cached_calls
from experiments.metrics import per_type, question_type
from experiments.runs.failures import failure_counts, failure_summary, failure_table, page_link
from experiments.runs.results import (
    SWEEP_FIELDS,
    load_runs,
    question_types,
    read_run_file,
    recorded_index,
    recorded_program,
    recorded_retriever,
    run_questions,
    system_rows,
)
from experiments.stats import describe_difference, paired_difference
from modules.config import TUNABLES
from modules.errors import HyperProveError
from pipeline.config import CHOOSE, LMConfig, ProgramConfig, replay_sources
from pipeline.files import atomic_write_bytes, read_json

OURS = ("hyperprove", "hyperprove-fixed", "hyperprove-passages")  # never "the best peer"
COMPARED = (("recall@5", "Recall@5", ("hyperprove", "hyperprove-fixed")), ("recall@2", "Recall@2", ("hyperprove", "hyperprove-fixed")),
            ("f1", "F1", ("hyperprove", "hyperprove-passages")))


def standing(difference: dict) -> str:
    """A paired difference in words: "ahead" or "behind" only when its interval excludes 0."""
    return {"better": "ahead", "worse": "behind"}.get(difference["verdict"], "not told apart")


def interval_cell(difference: dict | None) -> str:
    """A table cell: the mean difference and its paired bootstrap 95% interval ("–" for none)."""
    return "–" if difference is None else "{:+.2f} [{:+.2f}, {:+.2f}]".format(difference["mean"], *difference["interval95"])


def number(value: float | None, fmt: str = "{:.2f}") -> str:
    """A table cell for a figure that may be missing ("–")."""
    return fmt.format(value) if value is not None else "–"


def verdict(run: dict) -> list[str]:
    """HyperProve's Recall@5 and F1 against the best peer's, one sentence each, with the paired
    bootstrap interval when the run's predictions are there: "ahead" or "behind" only when the
    interval excludes 0."""
    systems, lines = run["systems"], []
    for metric, label, candidates in COMPARED:
        peers = {name: s[metric] for name, s in systems.items() if name not in OURS and s.get(metric) is not None}
        ours = [name for name in candidates if systems.get(name, {}).get(metric) is not None]
        if not peers or not ours:
            continue
        best = max(peers, key=peers.get)
        for name in ours[:1] if metric.startswith("recall") else ours:
            gap = systems[name][metric] - peers[best]
            relative = f" ({100 * gap / peers[best]:+.1f}% relative)" if peers[best] else ""
            sentence = f"{label}: {name} {systems[name][metric]:.2f} against the best peer, {best} {peers[best]:.2f}: {gap:+.2f}{relative}"
            difference = paired(run, name, run, best, metric)
            if difference:
                low, high = difference["interval95"]
                position = standing(difference)
                sentence += (f"; paired bootstrap 95% interval {low:+.2f} to {high:+.2f} (up on {difference['up']} questions, "
                             f"down on {difference['down']}, level on {difference['same']}), so {position}")
            lines.append(sentence + ".")
    return lines


SWEPT_COLUMNS = tuple((name, tunable.label) for name, tunable in TUNABLES.items())


def _facts(record: dict, command: str, extra: list[str]) -> str:
    facts = [f"command: `{command}`", *extra]
    if record.get("git_commit"):
        facts.append(f"commit {record['git_commit'][:10]}" + (" (uncommitted changes)" if record.get("git_dirty") == "true" else ""))
    if record.get("mlflow_run"):
        facts.append(f"MLflow run `{record['mlflow_run']}`")
    if record.get("finished"):
        facts.append(f"finished {record['finished']}")
    return "; ".join(facts) + "."


def recorded_calls(run: dict) -> str:
    """Whether `hyperprove reproduce` can rerun an LM run without the LM."""
    calls = run.get("lm_calls")
    if not calls:
        return f"no LM calls recorded (made before runs recorded them; `hyperprove reproduce {run_folder(run)}` asks the LM again)"
    return f"{calls['calls']:,} LM calls recorded ({calls['bytes'] / 1e6:.2f} MB; `hyperprove reproduce {run_folder(run)}` replays them)"


def run_folder(run: dict) -> str:
    """The run's results folder as a command names it (relative to the repository where it lies inside)."""
    folder = Path(run.get("results_dir", f"experiments/results/{run.get('name', '?')}")).resolve()
    return folder.relative_to(ROOT).as_posix() if folder.is_relative_to(ROOT) else folder.as_posix()


def render_sweep(sweep: dict, plots: Sequence[str] = ()) -> list[str]:
    """A sweep: the configured and the best parameters, scored where the sweep ran and held out;
    `plots` are links to its PNGs, relative to the report."""
    name = sweep["config"]["evaluation"].get("name") or sweep["study"]
    metrics = [sweep["objective"]] + ([sweep["tie_break"]] if sweep.get("tie_break") else [])
    checks = [(label, sweep[key]) for key, label in (("validation", "held out"), ("transfer", "transfer")) if sweep.get(key)]
    columns = [label for key, label in SWEPT_COLUMNS if key in sweep["best_params"]]
    header = columns + [f"{m} (train)" for m in metrics] + [f"{m} ({label})" for label, _ in checks for m in metrics]
    lines = [f"## {name}", ""]
    if sweep["config"]["evaluation"].get("description"):
        lines += [sweep["config"]["evaluation"]["description"], ""]
    lines += [_facts(sweep, f"hyperprove sweep --config experiments/configs/{name}.json", [
        f"{sweep['complete']} complete and {sweep['pruned']} pruned trials on {sweep['n_questions']} questions of `{sweep['questions']}`"]
        + [f"{label}: {check['n_questions']} questions of `{check['questions']}`" for label, check in checks]), ""]
    lines += ["| parameters | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    rows = (("configured (trial 0)", sweep["start_params"], "start"), (f"best (trial {sweep['best_trial']})", sweep["best_params"], "best"))
    for label, params, kind in rows:
        scored = sweep.get(f"{kind}_scores") or {}
        cells = [f"{params[key]:.3f}" if isinstance(params[key], float) else str(params[key]) for key, _ in SWEPT_COLUMNS if key in params]
        cells += [f"{scored.get(m, float('nan')):.2f}" for m in metrics]
        cells += [f"{check[f'{kind}_scores'].get(m, float('nan')):.2f}" for _, check in checks for m in metrics]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    if sweep.get("difference"):
        lines += [f"Best minus configured, question by question, where the sweep ran: {describe_difference(sweep['difference'])}.", ""]
    for label, check in checks:
        best, start = check["best_scores"][sweep["objective"]], check["start_scores"][sweep["objective"]]
        position = "above" if best > start else "level with" if best == start else "below"
        where = "Held out" if label == "held out" else f"On `{check['questions']}` (another corpus)"
        lines += [f"{where}, the best parameters' {sweep['objective']} {best:.2f} is {position} the configured parameters' "
                  f"{start:.2f} ({best - start:+.2f})" + (f"; question by question: {describe_difference(check['difference'])}"
                                                         if check.get("difference") else "") + ".", ""]
    if plots:
        lines += ["Plots: " + ", ".join(f"[{Path(plot).stem}]({plot})" for plot in plots) + ".", ""]
    return lines


def same_setting(a: dict, b: dict) -> bool:
    """The same questions, corpus, decomposition, retriever, index and answer path: only the
    compiled program may differ (a record made before an option existed ran without it)."""
    ca, cb = a.get("config", {}), b.get("config", {})
    keys = ("questions", "corpus", "limit", "decomposition")
    skip = [run.get("evaluation", {}).get("skip") or 0 for run in (ca, cb)]
    return (all(ca.get("evaluation", {}).get(k) == cb.get("evaluation", {}).get(k) for k in keys) and skip[0] == skip[1]
            and recorded_retriever(a) == recorded_retriever(b) and recorded_index(a) == recorded_index(b)
            and {**recorded_program(a), "compiled": None} == {**recorded_program(b), "compiled": None})


def program_of(run: dict) -> str | None:
    """The compiled program a run used (None: the built-in demonstrations)."""
    return run.get("config", {}).get("program", {}).get("compiled")


def paired(run: dict, system: str, other_run: dict, other_system: str, metric: str) -> dict | None:
    """`system` in `run` minus `other_system` in `other_run` on `metric`, question by question
    (`paired_difference`); None unless both have predictions, on the same questions, with the metric."""
    rows, others = system_rows(run, system), system_rows(other_run, other_system)
    if not rows or not others or [r["id"] for r in rows] != [r["id"] for r in others] or metric not in rows[0]:
        return None
    return paired_difference(rows, others, metric)


def paired_table(run: dict) -> list[str]:
    """HyperProve minus every other system of the run, question by question, on each score the
    run has (F1, Recall@2, Recall@5): the mean difference and its paired bootstrap 95% interval."""
    systems = run["systems"]
    ours = next((name for name in ("hyperprove", "hyperprove-fixed") if name in systems), None)
    scores = [(key, label) for key, label in (("f1", "F1"), ("recall@2", "R@2"), ("recall@5", "R@5"))
              if ours and systems[ours].get(key) is not None]
    lines = []
    for other in [name for name in systems if name != ours] if scores else []:
        cells = []
        for key, _ in scores:
            difference = paired(run, ours, run, other, key) if systems[other].get(key) is not None else None
            cells.append(interval_cell(difference))
        if any(cell != "–" for cell in cells):
            lines.append(f"| {other} | " + " | ".join(cells) + " |")
    if not lines:
        return []
    head = [f"{ours} minus each system, question by question (mean difference [paired bootstrap 95% interval]):", "",
            f"| {ours} minus | " + " | ".join(label for _, label in scores) + " |", "|---|" + "---:|" * len(scores)]
    return head + lines + [""]


def typed_summaries(run: dict) -> list[dict]:
    """The run's summaries with `per_type` and, where systems answered, `failures`; a run recorded
    before these were counted gets them from its predictions and its questions file."""
    types, questions = None, None
    summaries = []
    for name, summary in run["systems"].items():
        rows = system_rows(run, name) if "per_type" not in summary or ("failures" not in summary and summary.get("f1") is not None) else None
        if rows and "per_type" not in summary:
            types = question_types(run) if types is None else types
            summary = {**summary, "per_type": per_type(rows, types)}
        if rows and "failures" not in summary and summary.get("f1") is not None:
            questions = run_questions(run) if questions is None else questions
            if {row["id"] for row in rows} <= {question.id for question in questions}:
                summary = {**summary, "failures": failure_summary(rows, questions)}
        summaries.append(summary)
    return summaries


def pages_link(run: dict, report_dir: Path):
    """A question's page of a system, relative to the report, where the run's predictions give one
    (`hyperprove pages RESULTS_FOLDER` writes the pages)."""
    results = Path(run.get("results_dir", ""))
    link = page_link(os.path.relpath(results / "pages", report_dir))
    return (lambda system, question_id: link(system, question_id)) if (results / "predictions.json").is_file() else (lambda *_: None)


def type_verdicts(run: dict, summaries: Sequence[dict]) -> list[str]:
    """Per question type, HyperProve against the peer best on that type (F1 where there is a
    reader, else Recall@2), with the paired bootstrap interval on that type's questions."""
    by_name = {s["system"]: s for s in summaries if s.get("per_type")}
    ours = next((name for name in ("hyperprove", "hyperprove-fixed") if name in by_name), None)
    if ours is None:
        return []
    score = "f1" if by_name[ours].get("f1") is not None else "recall@2"
    types, lines = question_types(run), []
    for kind, scores in by_name[ours]["per_type"].items():
        peers = {name: s["per_type"][kind][score] for name, s in by_name.items()
                 if name not in OURS and score in s["per_type"].get(kind, {})}
        if score not in scores or not peers:
            continue
        best = max(peers, key=peers.get)
        line = f"- {kind}: {ours} {scores[score]:.2f} against {best} {peers[best]:.2f}"
        rows, others = system_rows(run, ours), system_rows(run, best)
        if rows and others and types:
            keep = lambda group: [r for r in group if question_type(types.get(r["id"], "")) == kind]  # noqa: E731
            line += f" ({describe_difference(paired_difference(keep(rows), keep(others), score))})"
        lines.append(line + ".")
    label = dict(TYPE_SCORES)[score]
    return [f"{label} by question type, {ours} against the best peer on each type:", "", *lines, ""] if lines else []


def compiled_program(run: dict, runs: Sequence[dict] = ()) -> list[str]:
    """For a run with a compiled program: how the program was made (from the record beside it),
    and HyperProve's change against a run of the same setting with the built-in demonstrations."""
    compiled = program_of(run)
    if not compiled:
        return []
    lines = []
    for base in runs:
        if base is not run and not program_of(base) and same_setting(run, base):
            ours, theirs = run["systems"].get("hyperprove", {}), base["systems"].get("hyperprove", {})
            metrics = (("recall@2", "R@2"), ("recall@5", "R@5"), ("em", "EM"), ("f1", "F1"))
            deltas = [f"{label} {ours[key] - theirs[key]:+.2f}" for key, label in metrics if key in ours and key in theirs]
            if deltas:
                lines += [f"Against `{base['name']}` (the same setting, built-in demonstrations), hyperprove: {', '.join(deltas)}.", ""]
            differences = [paired(run, "hyperprove", base, "hyperprove", key) for key in ("recall@5", "f1")]
            described = [describe_difference(difference) for difference in differences if difference]
            if described:
                lines += ["Question by question: " + "; ".join(described) + ".", ""]
            break
    made = compile_record(run)
    if made is None:
        return [f"Program: `{compiled}` (no compile record beside it).", "", *lines]
    same = "" if made.get("program_sha256") == run.get("program_sha256") else " (the program has changed since this run)"
    held_out = "training examples it also chose on" if made.get("val_selects") else "held-out training examples"
    grades = (f"; its grade on {made['val_examples']} {held_out} went from {made['val_before']:.2f} to "
              f"{made['val_after']:.2f}") if made.get("val_examples") else ""
    pooled = made.get("pooled", {})
    traced = made.get("traced")
    source = (f"from the program's own calls on the {traced['counted']} of {traced['questions']} training questions it answered right"
              if traced else "of gold steps")
    examples = (f"{' and '.join(f'{n} {name} examples' for name, n in pooled.items())} {source}, "
                + CHOOSE[made.get("choose", "call")].format(n=made["per_call"]) if pooled else f"{made['train_examples']} training examples")
    return [f"Program: `{compiled}`{same}, compiled by `hyperprove compile` ({made['target']} with {made['optimizer']}, "
            f"{examples}, {made['lm_calls']} LM calls, "
            f"commit {str(made.get('git_commit', '?'))[:10]}){grades}.", "", *lines]


# --- every system through the same reader -------------------------------------------------------------
SAME_READER = ("musique-lm60", "2wiki-lm60", "hotpotqa-lm60")  # each reads every system's top 5 with the program's final reader


def render_same_reader(runs: Sequence[dict], heading: bool = True) -> list[str]:
    """One table of EM / F1 / Recall@5 for every system of the `SAME_READER` runs, where each
    peer's top 5 passages go to the program's own final reader, and each run's verdicts on F1 and
    Recall@5 against its best peer (`verdict`): the answer-level comparison on one screen (the
    README's headline table, without the heading)."""
    chosen = [run for name in SAME_READER for run in runs if run.get("name") == name]
    if not chosen:
        return []
    systems = list(dict.fromkeys(name for run in chosen for name in run["systems"]))
    cell = lambda summary: " / ".join(f"{summary[key]:.2f}" if summary.get(key) is not None else "–"  # noqa: E731
                                      for key in ("em", "f1", "recall@5"))
    lines = (["## Every system through the same reader", ""] if heading else []) + [
             "The first 60 dev questions of each set: the program answers by itself; every other system (and `hyperprove-passages`, "
             "the program's own top 5) hands its top 5 passages to the program's final reader. EM / F1 / R@5 (%); each run's own "
             f"section {'below' if heading else 'of experiments/REPORT.md'} has R@2, costs, the paired table and the failures.", "",
             "| system | " + " | ".join(f"{run['name']} ({run.get('n_questions', '?')})" for run in chosen) + " |",
             "|---|" + "---:|" * len(chosen)]
    lines += [f"| {name} | " + " | ".join(cell(run["systems"][name]) if name in run["systems"] else "–" for run in chosen) + " |"
              for name in systems]
    lines.append("")
    for run in chosen:
        lines += [f"- {run['name']}: {line}" for line in verdict(run) if line.startswith(("F1: hyperprove ", "Recall@5: "))]
    return lines + [""]


def reruns(runs: Sequence[dict]) -> list[tuple[dict, dict]]:
    """(rerun, first run) pairs: `<name>-final` with today's defaults against `<name>`, the same
    questions answered by an earlier program."""
    named = {run.get("name"): run for run in runs}
    return [(named[f"{name}-final"], named[name]) for name in SAME_READER if f"{name}-final" in named and name in named]


def render_reruns(runs: Sequence[dict], heading: bool = True) -> list[str]:
    """HyperProve on each `SAME_READER` set's 60 questions rerun with today's defaults: its F1 and
    Recall@5 against the first run's, question by question, against the rerun's best peer on F1
    and against ppr on Recall@5, with the LM calls beside; with `heading` (the report) also each
    rerun's F1 and Recall@5 against every peer."""
    pairs = reruns(runs)
    if not pairs:
        return []
    lines = (["## The first 60 dev questions again, with today's defaults", ""] if heading else []) + [
        "The first 60 dev questions of each set, HyperProve then (the first run's program) and now (`<set>-lm60-final`, every "
        "default chosen on train); changes and margins question by question (mean [paired bootstrap 95% interval]):", "",
        "| set | F1 then → now | F1 change | R@5 then → now | R@5 change | F1 minus best peer | R@5 minus ppr | LM calls/q then → now (s/q now) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for now, then in pairs:
        ours, before, systems = now["systems"]["hyperprove"], then["systems"]["hyperprove"], now["systems"]
        peers = [name for name in systems if name not in OURS and systems[name].get("f1") is not None]
        best = max(peers, key=lambda name: systems[name]["f1"]) if peers else None
        cells = [f"{number(before.get(key))} → {number(ours.get(key))}" for key in ("f1", "recall@5", "lm_calls_per_question")]
        changes = [interval_cell(paired(now, "hyperprove", then, "hyperprove", key)) for key in ("f1", "recall@5")]
        margins = [f"{interval_cell(paired(now, 'hyperprove', now, best, 'f1'))} ({best})" if best else "–",
                   interval_cell(paired(now, "hyperprove", now, "ppr", "recall@5")) if "ppr" in systems else "–"]
        lines.append(f"| {then['name'].removesuffix('-lm60')} | {cells[0]} | {changes[0]} | {cells[1]} | {changes[1]} | "
                     f"{margins[0]} | {margins[1]} | {cells[2]} ({number(ours.get('seconds_per_question'), '{:.1f}')}) |")
    if heading:
        lines += ["", "In each rerun, HyperProve minus each peer (the peers' top 5 through the program's final reader; "
                  "dense-iterative searches the program's own sub-queries):", "", "| rerun | peer | F1 | R@5 |", "|---|---|---:|---:|"]
        for now, _ in pairs:
            for peer in [name for name in now["systems"] if name not in OURS]:
                lines.append(f"| {now['name']} | {peer} | " + " | ".join(
                    interval_cell(paired(now, "hyperprove", now, peer, key)) for key in ("f1", "recall@5")) + " |")
    return lines + [""]


HEADLINE_RUN = "2wiki-lm300"  # hundreds of questions no earlier LM run saw: where the answer claims are made (its `-final` rerun when there)


POWERED = (HEADLINE_RUN, "musique-more-lm95", "hotpotqa-more-lm300")  # per set, the dev questions no earlier run saw, in their hundreds
RERUNS = ("-lexical", "-chosen", "-final")  # a set's reruns with the defaults chosen on train, newest first; the newest stands for the set


def newest(named: dict, name: str) -> dict | None:
    """A set's run as the defaults chosen on train left it: its `RERUNS` rerun, else the run itself."""
    return next((named[name + suffix] for suffix in RERUNS if name + suffix in named), named.get(name))


def render_headline(runs: Sequence[dict]) -> list[str]:
    """The README's headline: the `POWERED` sets side by side (`render_sets`), each set's
    compiled programs against its built-in demonstrations (`render_compiled`), then the
    `HEADLINE_RUN` rerun with today's defaults (`<name>-final`) or, without it, the run itself
    (`render_powered`); without either, the same-reader table of the 60-question runs."""
    named = {run.get("name"): run for run in runs}
    run = named.get(f"{HEADLINE_RUN}-final") or named.get(HEADLINE_RUN)
    if run is None:
        return render_same_reader(runs, heading=False)
    then = named.get(HEADLINE_RUN) if run["name"] != HEADLINE_RUN else None
    return render_sets(runs) + render_compiled(runs) + render_powered(run, then)


def compiled_runs(runs: Sequence[dict], named: dict, name: str) -> list[tuple[dict, dict]]:
    """(compiled run, built-in run) for a set: each run with a compiled program and the setting
    (`same_setting`) of one of the set's reruns (`RERUNS`, newest first) or of its first run,
    HyperProve among its systems; a `<name>-peers` run, which reruns the peers that read the
    program under it, is not one (`peer_runs` reads it)."""
    bases = [run for run in (*(named.get(name + suffix) for suffix in RERUNS), named.get(name)) if run and "hyperprove" in run["systems"]]
    found = []
    for run in runs:
        if program_of(run) and "hyperprove" in run["systems"] and not run.get("name", "").endswith("-peers"):
            base = next((base for base in bases if same_setting(run, base)), None)
            found += [(run, base)] if base else []
    return found


def peer_runs(named: dict, run: dict, base: dict) -> dict[str, dict]:
    """Each peer of `run` and the run that holds it: the run's own, else its `<name>-peers` rerun's
    (the peers that read the program, rerun under its compiled program), else `base`'s (peers that
    do not read the program answer the same under any program)."""
    holders = [run, named.get(f"{run.get('name')}-peers"), base]
    found: dict[str, dict] = {}
    for holder in [holder for holder in holders if holder]:
        for name, summary in holder["systems"].items():
            if name not in OURS and summary.get("f1") is not None:
                found.setdefault(name, holder)
    return found


def cost_cell(summary: dict) -> str:
    """LM calls a question and seconds a question, with the calls a record or the cache answered
    (they take no LM time) named where there were any."""
    calls, seconds = summary.get("lm_calls_per_question"), summary.get("seconds_per_question")
    replayed = summary.get("lm_cache_hits", 0) / summary["n"] if summary.get("n") and summary.get("lm_cache_hits") else 0
    return f"{number(calls)} ({number(seconds, '{:.1f}')}" + (f"; {replayed:.2f} replayed" if replayed else "") + ")"


def live_cost(named: dict, run: dict) -> str:
    """`cost_cell` of HyperProve in `run`, or, where the run replayed nearly all its calls from
    another run's record (a rerun that changed few calls), in the run that made them, named."""
    made = run
    while (source := replayed_from(named, made)) is not None:
        made = source
    return cost_cell(made["systems"]["hyperprove"]) + (f" in `{made['name']}`" if made is not run else "")


def replayed_from(named: dict, run: dict) -> dict | None:
    """The run whose record `run` took at least `REPLAYED` of HyperProve's calls from, if any.
    Where it replays several records, the runs of its own program among them are the parts that
    made its calls, a block of questions each: their costs weighted by questions stand for it."""
    summary = run["systems"]["hyperprove"]
    calls = (summary.get("lm_calls_per_question") or 0) * summary.get("n", 0)
    if not (calls and summary.get("lm_cache_hits", 0) >= REPLAYED * calls):
        return None
    replay = run.get("config", {}).get("lm", {}).get("replay")
    sources = [source for part in replay_sources(replay) if (source := named.get(Path(part).name)) is not None
               and source is not run and "hyperprove" in source["systems"]]
    if len(sources) <= 1:
        return sources[0] if sources else None
    parts = [source for source in sources if recorded_program(source) == recorded_program(run)]
    return parts_run(parts) if parts else None


def parts_run(parts: Sequence[dict]) -> dict:
    """Runs of one program on blocks of questions as one run: HyperProve's calls, cached calls and
    seconds a question weighted by each part's questions."""
    n = sum(part["systems"]["hyperprove"]["n"] for part in parts)

    def weighted(key: str) -> float:
        return sum((part["systems"]["hyperprove"].get(key) or 0) * part["systems"]["hyperprove"]["n"] for part in parts) / n

    summary = {"n": n, "lm_calls_per_question": weighted("lm_calls_per_question"), "seconds_per_question": weighted("seconds_per_question"),
               "lm_cache_hits": sum(part["systems"]["hyperprove"].get("lm_cache_hits", 0) for part in parts)}
    return {"name": " + ".join(part["name"] for part in parts), "systems": {"hyperprove": summary}, "config": {}}


REPLAYED = 0.9  # a rerun that took at least this share of its calls from a record costs what that record's run did


def render_sets(runs: Sequence[dict]) -> list[str]:
    """HyperProve on each `POWERED` set (its `newest` run, then each run of a program compiled for
    it): F1 against the best peer's, with the paired interval and as a multiple, Recall@5 against
    ppr's, and the cost."""
    named = {run.get("name"): run for run in runs}
    rows = []
    for name in POWERED:
        base = newest(named, name)
        if base and "hyperprove" in base["systems"]:
            rows += [(base, base), *compiled_runs(runs, named, name)]
    if not rows:
        return []
    lines = ["Each set's dev questions that no earlier run saw, every peer's top 5 through the program's final reader: HyperProve "
             "minus its best peer on F1 and minus ppr on Recall@5 (mean [paired bootstrap 95% interval]), in %; a program compiled "
             "on the set's train split under its built-in one:", "",
             "| run | program | dev questions | HyperProve F1 | best peer F1 | F1 minus best peer | × best peer | HyperProve R@5 "
             "| R@5 minus ppr | LM calls/q (s/q) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run, base in rows:
        ours, peers = run["systems"]["hyperprove"], peer_runs(named, run, base)
        best = max(peers, key=lambda peer: peers[peer]["systems"][peer]["f1"]) if peers else None
        best_f1 = peers[best]["systems"][best]["f1"] if best else None
        skip, n = run.get("config", {}).get("evaluation", {}).get("skip", 0), run.get("n_questions", ours.get("n"))
        program = f"`{Path(program_of(run)).stem}`" if program_of(run) else "built-in"
        lines.append(f"| {run['name']} | {program} | {skip + 1}-{skip + n} ({n}) | {number(ours.get('f1'))} | "
                     + (f"{number(best_f1)} ({best}) | {interval_cell(paired(run, 'hyperprove', peers[best], best, 'f1'))} | "
                        f"{number(best_f1 and ours['f1'] / best_f1 or None)} | " if best else "– | – | – | ")
                     + f"{number(ours.get('recall@5'))} | "
                     + (interval_cell(paired(run, "hyperprove", peers["ppr"], "ppr", "recall@5")) if "ppr" in peers else "–")
                     + f" | {live_cost(named, run)} |")
    return lines + [""]


def compile_record(run: dict) -> dict | None:
    """The compile record beside a run's compiled program (None: no program, or no record)."""
    path = ROOT / Path(program_of(run) or "").with_suffix(".record.json")
    return read_json(path, "compile record") if program_of(run) and path.is_file() else None


def render_compiled(runs: Sequence[dict]) -> list[str]:
    """Each `POWERED` set's compiled programs against its built-in demonstrations on the same
    questions (paired), with what making the program cost."""
    named = {run.get("name"): run for run in runs}
    lines = []
    for name in POWERED:
        for run, base in compiled_runs(runs, named, name):
            made = compile_record(run) or {}
            config = Path(program_of(run)).stem
            command = (f"`hyperprove compile --config experiments/configs/{config}.json`"
                       if (ROOT / "experiments" / "configs" / f"{config}.json").is_file() else f"`{program_of(run)}`")
            cost = f"{made['lm_calls']} LM calls, {made['seconds']:.0f} s" if "lm_calls" in made and "seconds" in made else "–"
            ours, theirs = run["systems"]["hyperprove"], base["systems"]["hyperprove"]
            lines.append(f"| {base['name']} | {run['name']} | {command} | {cost} | {number(theirs.get('f1'))} → {number(ours.get('f1'))} | "
                         f"{interval_cell(paired(run, 'hyperprove', base, 'hyperprove', 'f1'))} | "
                         f"{interval_cell(paired(run, 'hyperprove', base, 'hyperprove', 'recall@5'))} |")
    if not lines:
        return []
    return ["Compiled programs against the built-in demonstrations, HyperProve on the same questions (compiled minus built-in, "
            "mean [paired bootstrap 95% interval]) and what making the program cost:", "",
            "| built-in | compiled | made by | making it | F1 | F1 change | R@5 change |", "|---|---|---|---|---:|---:|---:|",
            *lines, ""]


def render_powered(run: dict, then: dict | None = None) -> list[str]:
    """One run's answer claim: every system's EM / F1 / R@5 and cost, HyperProve's F1 against each
    peer (paired bootstrap 95% interval) and as a multiple of the best peer's, and where each
    system's wrong answers failed (the first stage that failed; by question type: the report). With `then`, an
    earlier run on the same questions, also HyperProve's change since it, with its LM calls."""

    summaries = with_cached_calls(typed_summaries(run))
    cached = any("cached_calls_per_question" in s for s in summaries)
    skip = run.get("config", {}).get("evaluation", {}).get("skip", 0)
    n = run.get("n_questions", summaries[0].get("n"))
    lines = [f"`{run['name']}`: dev questions {skip + 1}-{skip + n} ({n}); the program answers by itself, every other system hands "
             "its top 5 passages to the program's final reader. EM / F1 / R@5 in %, LM calls and seconds a question"
             + (" (calls the record or the cache answered take no LM time, so s/q is not all LM time)" if cached else "") + ":", "",
             "| system | EM | F1 | R@5 | LM calls/q | " + ("of them cached/q | " if cached else "") + "s/q |",
             "|---|---:|---:|---:|---:|" + ("---:|" if cached else "") + "---:|"]
    lines += [f"| {s['system']} | {number(s.get('em'))} | {number(s.get('f1'))} | {number(s.get('recall@5'))} | "
              f"{number(s.get('lm_calls_per_question'))} | " + (f"{number(s.get('cached_calls_per_question'))} | " if cached else "")
              + f"{number(s.get('seconds_per_question'), '{:.1f}')} |" for s in summaries]
    systems = run["systems"]
    peers = [name for name in systems if name not in OURS and systems[name].get("f1") is not None]
    if "hyperprove" in systems and peers:
        lines.append("")
        for peer in peers:
            difference = paired(run, "hyperprove", run, peer, "f1")
            gap = systems["hyperprove"]["f1"] - systems[peer]["f1"]
            told = ""
            if difference:
                low, high = difference["interval95"]
                position = standing(difference)
                told = f" [{low:+.2f}, {high:+.2f}] (up on {difference['up']} questions, down on {difference['down']}), {position}"
            lines.append(f"- F1, hyperprove minus {peer}: {gap:+.2f}{told}.")
        if systems.get("hyperprove-passages", {}).get("f1") is not None and (difference := paired(run, "hyperprove", run, "hyperprove-passages", "f1")):
            position = standing(difference)
            lines.append(f"- F1, hyperprove minus hyperprove-passages (its own top 5 through the peers' reader): {interval_cell(difference)}, {position}.")
        best = max(peers, key=lambda name: systems[name]["f1"])
        if systems[best]["f1"]:
            lines.append(f"- hyperprove's F1 is {systems['hyperprove']['f1'] / systems[best]['f1']:.2f} times the best peer's ({best}).")
    if then and "hyperprove" in systems and (difference := paired(run, "hyperprove", then, "hyperprove", "f1")):
        before = then["systems"]["hyperprove"]
        lines.append(f"- F1, hyperprove minus the same questions' first run (`{then['name']}`, before today's defaults): "
                     f"{number(before.get('f1'))} → {number(systems['hyperprove'].get('f1'))}, {interval_cell(difference)} "
                     f"(up on {difference['up']} questions, down on {difference['down']}), {difference['verdict']}; LM calls a question "
                     f"{number(before.get('lm_calls_per_question'))} → {number(systems['hyperprove'].get('lm_calls_per_question'))}.")
    failing = [s for s in summaries if s.get("failures")]
    if failing:
        lines += ["", "Answered right, and the wrong answers by the first stage that failed (after retrieval: the right passages "
                  "were there):", "", *failure_counts(failing)]
    return lines + [""]


# --- the program's answer path, chosen on train ------------------------------------------------------
def is_choice(run: dict) -> bool:
    """A train run that measures program options (`<dataset>-train-<variant>`)."""
    return "-train-" in run.get("name", "")


def answer_path(settings: dict, system: str) -> str:
    """The program options that make an answer path, in words ("reader: passages; question channel")."""
    reader = "passages-only" if system == "hyperprove-passages" else settings["reader_evidence"]
    words = [f"reader: {reader}"]
    words += ["question channel"] if settings["question_channel"] else []
    words += [f"entity retries {settings['entity_retries']}"] if settings["entity_retries"] else []
    words += ["grounded hops"] if settings["grounded_hops"] else []
    words += ["comparison demos"] if settings["comparison_demos"] else []
    words += [f"decomposer reads {settings['decompose_facts']} facts"] if settings.get("decompose_facts") else []
    words += ["hop answers grounded in any of the hop's facts"] if settings.get("grounded_in") == "evidence" else []
    words += ["bridges by rule"] if settings.get("bridge_rewrite") == "rule" else []
    words += ["answers chosen between named options"] if settings.get("choose_options") else []
    words += ["identity steps folded"] if settings.get("fold_identities") else []
    words += ["chains checked"] if settings.get("chain_checks") else []
    words += ["hop answers about the hop's subject"] if settings.get("hop_subject") else []
    words += ["countries by any name"] if settings.get("country_names") else []
    words += ["comparison plans by rule"] if settings.get("comparison_plans") else []
    words += ["comparisons by rule"] if settings.get("compare_by_rule") else []
    words += ["last hop answers"] if settings.get("last_hop_answers") else []
    words += [f"hop reader + {n} facts of the top passage"] if (n := settings.get("hop_passage_facts")) else []
    words += [f"{adapter} adapter"] if (adapter := settings.get("adapter", "chat")) != "chat" else []
    words += [f"compiled `{settings['compiled']}`"] if settings["compiled"] else []
    return "; ".join(words)


def render_choices(runs: Sequence[dict]) -> list[str]:
    """Per dataset, every answer path its train runs measured (the program, and its top 5 passages
    through the same reader), each against the first run's program question by question."""
    lines = ["## The program's answer path, chosen on train", "",
             "Each train run below scores one setting of the program's options on a dataset's train questions; `hyperprove-passages` "
             "rows are the same program's top 5 passages read alone (the path's LM calls are the program's: all its steps but the final "
             "answer, then the reader). F1 differences are against the first row, question by question (paired bootstrap 95% interval). "
             f"The defaults in `ProgramConfig` now: {answer_path({**asdict(ProgramConfig()), 'adapter': LMConfig().layout}, 'hyperprove')}.", ""]
    datasets: dict[str, list[dict]] = {}
    for run in runs:
        datasets.setdefault(run["name"].split("-train-")[0], []).append(run)
    for dataset, group in datasets.items():
        group = sorted(group, key=lambda run: (not run["name"].endswith("-train-facts"), run.get("finished", "")))
        paths = [(run, system) for run in group for system in ("hyperprove", "hyperprove-passages") if system in run["systems"]]
        base_run, base_system = paths[0]
        lines += [f"### {dataset} train", "", "| answer path | run | n | EM | F1 | R@5 | LM calls/q | F1 against the first row |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for run, system in paths:
            summary = run["systems"][system]
            difference = paired(run, system, base_run, base_system, "f1") if (run, system) != (base_run, base_system) else None
            against = "–"
            if difference:
                low, high = difference["interval95"]
                against = f"{difference['mean']:+.2f} [{low:+.2f}, {high:+.2f}] {difference['verdict']}"
            if system == "hyperprove-passages":  # the path runs the program (all but its final answer), then the reader
                summary = {**summary, "lm_calls_per_question": run["systems"]["hyperprove"].get("lm_calls_per_question")}
            cells = [f"{summary[key]:.2f}" if summary.get(key) is not None else "–" for key in ("em", "f1", "recall@5", "lm_calls_per_question")]
            lines.append(f"| {answer_path(recorded_program(run), system)} | `{run['name']}` ({system}) | "
                         f"{summary.get('n', '?')} | " + " | ".join(cells) + f" | {against} |")
        lines += ["", "Commands: " + "; ".join(
            f"`hyperprove evaluate --config experiments/configs/{run['name']}.json`" + (f" (commit {run['git_commit'][:10]})" if run.get("git_commit") else "")
            for run in group) + ".", ""]
    return lines


def render(runs: list[dict], sweeps: Sequence[tuple[dict, list[str]]] = (), report_dir: Path = ROOT / "experiments") -> str:
    lines = [
        "# HyperProve benchmark report",
        "",
        "Generated by `python -m experiments.runs.report` from `experiments/results/*/results.json`; each section",
        "names the command that reproduces it. R@k: Recall@k over gold passages (%); EM/F1: answer exact match",
        "and token F1 (%); s/q: wall seconds per question (retrieval, plus LM calls where there are any);",
        "retrieval ms/q: the retrieval part alone, embedding the system's own queries included (MiniLM on the",
        "CPU, about 10 ms a query). \"–\": does not apply (no reader in that setting).",
        "",
        "Systems: " + "; ".join(f"`{name}`: {text}" for name, text in SYSTEMS.items()) + ".",
        "",
    ]
    lines += render_same_reader(runs)
    lines += render_reruns(runs)
    for run in [run for run in runs if not is_choice(run)]:
        name = run.get("name", "?")
        lines += [f"## {name}", ""]
        if run.get("description"):
            lines += [run["description"], ""]
        extra = [f"{run.get('n_questions', '?')} questions"] + ([f"LM `{run['lm']}`", recorded_calls(run)] if run.get("lm") else [])
        lines += [_facts(run, f"hyperprove evaluate --config experiments/configs/{name}.json", extra), "",
                  results_table(list(run["systems"].values())).rstrip(), ""]
        judged = verdict(run)
        if judged:
            lines += [*judged, ""]
        lines += paired_table(run)
        summaries = typed_summaries(run)
        tables = per_type_tables(summaries).replace("\n## ", "\n### ")
        if tables:
            lines += [tables.strip(), "", *type_verdicts(run, summaries)]
        failures = failure_table(summaries, pages_link(run, report_dir)).replace("\n## ", "\n### ")
        if failures:
            lines += [failures.strip(), ""]
        lines += compiled_program(run, runs)
    choices = [run for run in runs if is_choice(run)]
    if choices:
        lines += render_choices(choices)
    for sweep, plots in sweeps:
        lines += render_sweep(sweep, plots)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    parser.add_argument("--out", default=str(ROOT / "experiments" / "REPORT.md"))
    parser.add_argument("--readme", help="also write the headline table into this README, between its headline markers")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(Path(args.results))
        report_dir = Path(args.out).resolve().parent
        sweeps = [(read_run_file(path, "sweep", SWEEP_FIELDS), [os.path.relpath(png, report_dir) for png in sorted(path.parent.glob("*.png"))])
                  for path in sorted(Path(args.results).resolve().glob("*/sweep.json"))]
    except HyperProveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not runs:
        print(f"error: no results.json under {args.results}", file=sys.stderr)
        return 2
    if args.readme:
        try:
            write_headline(Path(args.readme), render_headline(runs))
        except HyperProveError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"{args.readme}: the headline table")
    atomic_write_bytes(Path(args.out), render(runs, sweeps, report_dir).encode())
    print(f"{args.out}: {len(runs)} evaluate runs, {len(sweeps)} sweeps")
    return 0


HEADLINE = ("<!-- headline table: generated by experiments/runs/report.py --readme README.md -->", "<!-- end of the headline table -->")


def write_headline(readme: Path, lines: list[str]) -> None:
    """Replace what lies between the README's two HEADLINE markers with `lines`."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(HEADLINE[0]), text.find(HEADLINE[1])
    if start < 0 or end < start:
        raise HyperProveError(f"{readme}: has no headline markers ({HEADLINE[0]} ... {HEADLINE[1]})")
    body = "\n".join(lines).strip()
    atomic_write_bytes(readme, (text[: start + len(HEADLINE[0])] + "\n\n" + body + "\n\n" + text[end:]).encode())


if __name__ == "__main__":
    sys.exit(main())
