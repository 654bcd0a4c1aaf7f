"""What the program's answers would be without the final reader's call, from committed predictions.

    python -m experiments.tools.skip_reader musique-train-chosen hotpotqa-train-chosen

Two rules that save step 11's LM call, scored on runs already made (no LM needed): "chain" answers
with the last hop's answer when the last sub-question refers to an earlier answer ("#k") or the
decomposition has one hop, and keeps the reader for the rest (comparisons need it); "one hop"
does so only for one-hop decompositions. F1 against the reader's answers on the same questions,
paired bootstrap 95% interval. Use train runs: choosing on dev would spoil dev.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from experiments.metrics import f1_score
from experiments.runs.results import gold_answers, system_rows
from experiments.stats import describe_difference, paired_difference
from modules.lm.references import references

RULES = {
    "chain": lambda chain: len(chain) == 1 or bool(references(chain[-1]["sub_question"])),
    "one hop": lambda chain: len(chain) == 1,
}


def rule_rows(rows: list[dict], golds: dict[str, list[str]], applies) -> list[dict]:
    """Each question's F1 (best over the answer and its aliases, as evaluate scores it) when the
    rule answers with the last hop's answer where it applies."""
    scored = []
    for row in rows:
        chain = row["chain"]
        answer = chain[-1]["answer"] if chain and applies(chain) else row["answer"]
        scored.append({"id": row["id"], "f1": f1_score(answer, golds[row["id"]])})
    return scored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="results folders under experiments/results/ with a `hyperprove` system")
    args = parser.parse_args(argv)
    for run in args.runs:
        folder = ROOT / "experiments" / "results" / run
        rows = system_rows({"results_dir": str(folder)}, "hyperprove")
        golds = gold_answers(folder)
        for name, applies in RULES.items():
            covered = sum(bool(row["chain"]) and applies(row["chain"]) for row in rows)
            difference = paired_difference(rule_rows(rows, golds, applies), rows, "f1")
            print(f"{run}: rule {name!r} answers {covered} of {len(rows)} without the reader: {describe_difference(difference)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
