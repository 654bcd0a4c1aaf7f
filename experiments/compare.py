"""Two systems on the same questions, question by question: the mean difference of a score and
its paired bootstrap 95% interval (`experiments/stats.py`), for runs the report does not pair.

    python experiments/compare.py hotpotqa-train-chosen:hyperprove hotpotqa-retrieval-train:ppr --metrics recall@5 recall@2

Each side is RESULTS:SYSTEM: a results folder (a name under experiments/results/, or a path)
and a system in its predictions.json. The first side minus the second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.report import system_rows  # noqa: E402
from experiments.stats import describe_difference, paired_difference  # noqa: E402
from modules.errors import HyperProveError  # noqa: E402


def side_rows(side: str) -> list[dict]:
    """The per-question rows of RESULTS:SYSTEM, in question-id order."""
    folder, _, system = side.rpartition(":")
    if not folder or not system:
        raise HyperProveError(f"{side!r}: expected RESULTS:SYSTEM, e.g. hotpotqa-train-chosen:hyperprove")
    path = Path(folder) if Path(folder).is_dir() else ROOT / "experiments" / "results" / folder
    rows = system_rows({"results_dir": str(path)}, system)
    if not rows:
        raise HyperProveError(f"{path}/predictions.json: no system {system!r} (or no such results folder)")
    return rows


def compare(first: str, second: str, metrics: list[str]) -> list[str]:
    rows, others = side_rows(first), side_rows(second)
    if [row["id"] for row in rows] != [row["id"] for row in others]:
        raise HyperProveError(f"{first} and {second} did not answer the same questions; a paired difference needs the same ones")
    lines = []
    for metric in metrics:
        if metric not in rows[0] or metric not in others[0]:
            raise HyperProveError(f"{metric!r} is not scored in both {first} and {second}")
        lines.append(f"{first} minus {second}: {describe_difference(paired_difference(rows, others, metric))}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="RESULTS:SYSTEM")
    parser.add_argument("second", help="RESULTS:SYSTEM")
    parser.add_argument("--metrics", nargs="+", default=["f1"], help="per-question scores: f1, em, recall@2, recall@5")
    args = parser.parse_args(argv)
    try:
        print("\n".join(compare(args.first, args.second, args.metrics)))
    except HyperProveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
