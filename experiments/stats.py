"""Paired comparisons of two systems (or two parameter sets) on the same questions.

Why: on 40-60 questions one gold passage moves Recall@5 by about half a point, so a difference
in means is partly luck; a paired bootstrap interval over the per-question differences says
whether it is more than that. "better" or "worse" only when the interval excludes 0.
"""

from __future__ import annotations

from typing import Sequence

from modules.errors import HyperProveError


def paired_difference(rows: Sequence[dict], baseline: Sequence[dict], metric: str, resamples: int = 10_000, seed: int = 0) -> dict:
    """`rows` minus `baseline` on `metric`, question by question (percent): the mean, a paired
    bootstrap 95% interval (`scipy.stats.bootstrap`, percentile method, seeded: the same interval
    on every run), and how many questions went up, down or stayed."""
    import numpy as np
    from scipy import stats

    if len(rows) != len(baseline) or not rows:
        raise HyperProveError(f"paired difference: {len(rows)} rows against {len(baseline)}; both need the same questions")
    differences = 100 * (np.array([row[metric] for row in rows], dtype=float) - np.array([row[metric] for row in baseline], dtype=float))
    if len(differences) == 1:  # every resample of one question is that question
        low = high = differences[0]
    else:
        interval = stats.bootstrap((differences,), np.mean, n_resamples=resamples, confidence_level=0.95, method="percentile",
                                   random_state=np.random.default_rng(seed)).confidence_interval
        low, high = interval.low, interval.high
    return {
        "metric": metric,
        "mean": round(float(differences.mean()), 2),
        "interval95": [round(float(low), 2) + 0.0, round(float(high), 2) + 0.0],  # + 0.0: no "-0.00" for a bound at zero
        "up": int((differences > 0).sum()), "down": int((differences < 0).sum()), "same": int((differences == 0).sum()),
        "verdict": "better" if low > 0 else "worse" if high < 0 else "within noise",
    }


def describe_difference(difference: dict) -> str:
    """One line: "recall@5 +0.63 (95% interval -0.42 to +1.88; 2 up, 1 down, 37 same): within noise"."""
    low, high = difference["interval95"]
    return (f"{difference['metric']} {difference['mean']:+.2f} (95% interval {low:+.2f} to {high:+.2f}; {difference['up']} up, "
            f"{difference['down']} down, {difference['same']} same): {difference['verdict']}")
