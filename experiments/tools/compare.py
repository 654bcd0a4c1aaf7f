"""Two systems on the same questions, question by question: the mean difference of a score and
its paired bootstrap 95% interval (`experiments/stats.py`), for runs the report does not pair.

    python -m experiments.tools.compare hotpotqa-train-chosen:hyperprove hotpotqa-retrieval-train:ppr --metrics recall@5 recall@2
    python -m experiments.tools.compare --choices hotpotqa-train-choose:hyperprove hotpotqa-train-choose:hyperprove-passages

    python -m experiments.tools.compare musique-lm60:hyperprove musique-lm60:dense --metrics f1 em --first 20
    python -m experiments.tools.compare --costs hotpotqa-lm60-fast:hyperprove hotpotqa-lm60:hyperprove --metrics f1 recall@5
    python -m experiments.tools.compare 2wiki-lm300:hyperprove 2wiki-lm300:dense-iterative --where reader --types compositional inference
    python -m experiments.tools.compare --pooled musique-train-lexical:hyperprove musique-train-hop-passage:hyperprove \
        hotpotqa-train-lexical:hyperprove hotpotqa-train-both:hyperprove

Each side is RESULTS:SYSTEM: a results folder (a name under experiments/results/, or a path)
and a system in its predictions.json. The first side minus the second, then each side's mean.
With `--choices`, each side against itself with the final answers that `choose_options`
replaced put back: the same run without the choices, since the choice is the last step of a
question. `--first N` keeps the first N questions of the first side's questions file (the
questions `evaluate --limit N` would answer), to pair a subset of two larger runs; `--where
by-rule` (or `reader`) keeps the questions the first side answered by rule (or with its
reader), `--types T ...` those of some question types. With `--costs`, first a table of what
each side's LM calls cost a question (from each row's `lm_steps`) beside its scores: the
before/after table of a cheaper answer path. Where both runs recorded their LM calls, a first
line says how many requests they share and how many of those got the same reply: two options
compared on the same calls share all but the ones an option changes. With `--pooled`, the sides
are pairs (first, second, first, second, ...) of one option on several sets: each pair, then all
their questions pooled into one paired interval, as an option chosen across sets is judged.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from experiments.metrics import exact_match, f1_score
from experiments.runs.results import folder_questions, gold_answers, system_rows
from experiments.stats import describe_difference, paired_difference
from modules.errors import HyperProveError


def side_folder(side: str) -> tuple[Path, str]:
    """The results folder and the system of RESULTS:SYSTEM."""
    folder, _, system = side.rpartition(":")
    if not folder or not system:
        raise HyperProveError(f"{side!r}: expected RESULTS:SYSTEM, e.g. hotpotqa-train-chosen:hyperprove")
    return (Path(folder) if Path(folder).is_dir() else ROOT / "experiments" / "results" / folder), system


def side_rows(side: str) -> list[dict]:
    """The per-question rows of RESULTS:SYSTEM, in question-id order."""
    path, system = side_folder(side)
    rows = system_rows({"results_dir": str(path)}, system)
    if not rows:
        raise HyperProveError(f"{path}/predictions.json: no system {system!r} (or no such results folder)")
    return rows


def first_questions(side: str, n: int) -> set[str]:
    """The ids of the first `n` questions of the file a side's run answered, in the file's order."""
    folder, _ = side_folder(side)
    ids = [question.id for question in folder_questions(folder)][:n]
    if len(ids) < n:
        raise HyperProveError(f"{folder}/results.json: its questions file is not here or holds fewer than {n} questions")
    return set(ids)


@dataclass(frozen=True)
class Subset:
    """Which questions to pair: the first N of the first side's questions file, those the first
    side answered by rule (`where="by-rule"`) or with its reader (`"reader"`), those of some types."""

    first_n: int | None = None
    where: str | None = None
    types: tuple[str, ...] = ()

    def ids(self, side: str, rows: list[dict]) -> set[str] | None:
        """The ids of `side`'s questions in the subset (None: all of them)."""
        if self.first_n is None and self.where is None and not self.types:
            return None
        ids = {row["id"] for row in rows}
        if self.first_n is not None:
            ids &= first_questions(side, self.first_n)
        if self.where is not None:
            ids &= {row["id"] for row in rows if ("by_rule" in row) == (self.where == "by-rule")}
        if self.types:
            folder, _ = side_folder(side)
            ids &= {question.id for question in folder_questions(folder) if question.type in self.types}
        return ids


def paired_rows(first: str, second: str, subset: Subset = Subset()) -> tuple[list[dict], list[dict]]:
    """Both sides' rows, only the `subset`'s questions (chosen by the first side). Where the second
    side answered every question of the first and more (the first a `--limit`ed rerun of it), the
    first side's questions are the ones paired."""
    rows, others = side_rows(first), side_rows(second)
    kept = subset.ids(first, rows)
    if kept is None and {row["id"] for row in rows} < {row["id"] for row in others}:
        kept = {row["id"] for row in rows}
    if kept is not None:
        rows, others = [row for row in rows if row["id"] in kept], [row for row in others if row["id"] in kept]
    return rows, others


def shared_calls(first: str, second: str) -> list[str]:
    """What the two runs' recorded LM calls share (`evaluate --replay RUN --live` makes an option's
    run share every call the option does not change); nothing when either run has no record."""
    from pipeline.lm.record import RECORD_FILE, read_record

    folders = [side_folder(side)[0] for side in (first, second)]
    if not all((folder / RECORD_FILE).is_file() for folder in folders):
        return []
    records = [read_record(folder) for folder in folders]
    both, same = records[0].shared_with(records[1])
    return [f"LM calls: {len(records[0].calls)} and {len(records[1].calls)} recorded; {both} requests in both, {same} of them with the same reply"]


def checked_rows(first: str, second: str, metrics: list[str], subset: Subset = Subset()) -> tuple[list[dict], list[dict]]:
    """`paired_rows`, refused unless both sides answered the same questions and score every metric."""
    rows, others = paired_rows(first, second, subset)
    if not rows or [row["id"] for row in rows] != [row["id"] for row in others]:
        raise HyperProveError(f"{first} and {second} did not answer the same questions; a paired difference needs the same ones")
    for metric in metrics:
        if metric not in rows[0] or metric not in others[0]:
            raise HyperProveError(f"{metric!r} is not scored in both {first} and {second}")
    return rows, others


def difference_lines(label: str, rows: list[dict], others: list[dict], metrics: list[str]) -> list[str]:
    """One line per metric: `rows` minus `others` question by question, then each side's mean."""
    lines = []
    for metric in metrics:
        means = [100 * sum(row[metric] for row in side) / len(side) for side in (rows, others)]
        lines.append(f"{label}: {describe_difference(paired_difference(rows, others, metric))}; "
                     "{:.2f} against {:.2f} on {} questions".format(*means, len(rows)))
    return lines


def compare(first: str, second: str, metrics: list[str], subset: Subset = Subset()) -> list[str]:
    rows, others = checked_rows(first, second, metrics, subset)
    return shared_calls(first, second) + difference_lines(f"{first} minus {second}", rows, others, metrics)


def pooled(sides: list[str], metrics: list[str], subset: Subset = Subset()) -> list[str]:
    """Each pair of `sides` (first, second, first, second, ...) compared, then the questions of
    every pair pooled and resampled as one set: an option's difference over all the sets it was
    measured on, with the power of all their questions."""
    pairs = list(zip(sides[::2], sides[1::2]))
    lines, rows, others = [], [], []
    for first, second in pairs:
        mine, theirs = checked_rows(first, second, metrics, subset)
        lines += shared_calls(first, second) + difference_lines(f"{first} minus {second}", mine, theirs, metrics)
        rows, others = rows + mine, others + theirs
    return lines + difference_lines(f"pooled, {len(pairs)} pairs", rows, others, metrics)


COST_FIELDS = ("calls", "cache_hits", "prompt_tokens", "cached_prompt_tokens", "completion_tokens")


def module_costs(side: str, rows: list[dict]) -> dict[str, dict]:
    """Per LM module, what it cost a question on average (seconds: the wall time around its calls)."""
    if any("lm_steps" not in row for row in rows):
        raise HyperProveError(f"{side}: its predictions hold no lm_steps (a run from before the LM profile), so no cost per question")
    modules: dict[str, dict] = {}
    for row in rows:
        for module, cost in row["lm_steps"].items():
            total = modules.setdefault(module, dict.fromkeys((*COST_FIELDS, "seconds"), 0.0))
            for name in total:
                total[name] += cost[name] / len(rows)
    return modules


def cost_row(side: str, rows: list[dict], modules: dict[str, dict], metrics: list[str]) -> str:
    """One markdown row: what a side's LM calls cost a question (its `modules`' summed) and its mean scores. Prompt
    tokens are split into those the server computed and those its prompt cache served; seconds are
    the question's wall time, so a side whose calls DSPy's cache answered (its own column) is no cost figure."""
    spent = {name: sum(cost[name] for cost in modules.values()) for name in COST_FIELDS}
    seconds = sum(row["seconds"] for row in rows) / len(rows)
    cells = [f"{spent['calls']:.2f}", f"{spent['cache_hits']:.2f}", f"{spent['prompt_tokens'] - spent['cached_prompt_tokens']:.0f}",
             f"{spent['cached_prompt_tokens']:.0f}", f"{spent['completion_tokens']:.1f}", f"{seconds:.1f}"]
    return f"| {side} | " + " | ".join(cells + [f"{100 * sum(row[m] for row in rows) / len(rows):.2f}" for m in metrics]) + " |"


def module_rows(side: str, modules: dict[str, dict]) -> list[str]:
    """One markdown row per LM module of a side (its `module_costs`)."""
    return [f"| {side} | {module} | {cost['calls']:.2f} | {cost['prompt_tokens'] - cost['cached_prompt_tokens']:.0f} | "
            f"{cost['cached_prompt_tokens']:.0f} | {cost['completion_tokens']:.1f} | {cost['seconds']:.1f} |"
            for module, cost in modules.items()]


def costs(first: str, second: str, metrics: list[str], subset: Subset = Subset()) -> list[str]:
    """What the two sides' LM calls cost and their scores as markdown tables (whole, then per LM
    module), then the paired differences (`compare`)."""
    sides = list(zip((first, second), paired_rows(first, second, subset)))
    spent_by_module = [module_costs(side, rows) for side, rows in sides]
    head = ["LM calls/q", "DSPy cache hits/q", "computed prompt tok/q", "prompt tok/q from the server's cache", "generated tok/q", "s/q"]
    lines = ["| run | " + " | ".join(head + metrics) + " |", "|---|" + "---:|" * (len(head) + len(metrics))]
    lines += [cost_row(side, rows, spent, metrics) for (side, rows), spent in zip(sides, spent_by_module)]
    lines += ["", "| run | LM module | LM calls/q | computed prompt tok/q | prompt tok/q from the server's cache | generated tok/q | LM s/q |",
              "|---|---|---:|---:|---:|---:|---:|"]
    lines += [line for (side, _), spent in zip(sides, spent_by_module) for line in module_rows(side, spent)]
    return lines + [""] + compare(first, second, metrics, subset)


def without_choices(rows: list[dict], golds: dict[str, list[str]], source: str = "the run") -> tuple[list[dict], int]:
    """The rows with each final answer the chooser replaced put back and scored again against the
    gold answer and its aliases (`gold_answers` of `source`); and how many were put back."""
    undone, replaced = [], 0
    for row in rows:
        first = row.get("answer_before_choice")
        if first is None:
            undone.append(row)
            continue
        if row["id"] not in golds:
            raise HyperProveError(f"{source}: its questions file does not hold question {row['id']!r}")
        replaced += 1
        undone.append({**row, "answer": first, "em": float(exact_match(first, golds[row["id"]])), "f1": float(f1_score(first, golds[row["id"]]))})
    return undone, replaced


def choices(side: str, metrics: list[str]) -> list[str]:
    """What the choices did to a side: with them minus without, per metric."""
    rows, (folder, _) = side_rows(side), side_folder(side)
    undone, replaced = without_choices(rows, gold_answers(folder), f"{folder}/results.json")
    answers = "answer" if replaced == 1 else "answers"
    return [f"{side}: {replaced} final {answers} chosen between the question's options; with the choices minus without: "
            + describe_difference(paired_difference(rows, undone, metric)) for metric in metrics]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sides", nargs="+", help="RESULTS:SYSTEM RESULTS:SYSTEM (two; with --pooled any number of pairs; with --choices any number)")
    parser.add_argument("--metrics", nargs="+", default=["f1"], help="per-question scores: f1, em, recall@2, recall@5")
    parser.add_argument("--choices", action="store_true", help="each side with and without the final answers choose_options replaced")
    parser.add_argument("--first", type=int, metavar="N", help="only the first N questions of the first side's questions file")
    parser.add_argument("--where", choices=["by-rule", "reader"], help="only the questions the first side answered by rule, or with its reader")
    parser.add_argument("--types", nargs="+", default=[], metavar="TYPE", help="only questions of these types (e.g. compositional inference)")
    parser.add_argument("--costs", action="store_true", help="first a table of each side's LM calls, tokens and seconds a question")
    parser.add_argument("--pooled", action="store_true", help="the sides are pairs of one option on several sets: each pair, then all pooled")
    args = parser.parse_args(argv)
    if args.pooled and (len(args.sides) < 4 or len(args.sides) % 2):
        parser.error("--pooled takes two or more pairs of sides: FIRST SECOND FIRST SECOND ...")
    if not args.choices and not args.pooled and len(args.sides) != 2:
        parser.error("give two sides to compare (or --choices, or pairs with --pooled)")
    if args.pooled and (args.choices or args.costs):
        parser.error("--pooled goes with pairs of sides, not --choices or --costs")
    if args.first is not None and args.first < 1:
        parser.error("--first takes a whole number from 1")
    if args.choices and (args.first is not None or args.where or args.types):
        parser.error("--first, --where and --types go with two sides, not --choices")
    if args.costs and args.choices:
        parser.error("--costs goes with two sides, not --choices")
    try:
        if args.choices:
            lines = [line for side in args.sides for line in choices(side, args.metrics)]
        elif args.pooled:
            lines = pooled(args.sides, args.metrics, Subset(args.first, args.where, tuple(args.types)))
        else:
            lines = (costs if args.costs else compare)(*args.sides, args.metrics, Subset(args.first, args.where, tuple(args.types)))
        print("\n".join(lines))
    except HyperProveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
