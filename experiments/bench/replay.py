"""Every committed LM run that carries its recorded calls, reproduced from its folder with no LM
loaded; then a tampered copy of the first, caught.

    python -m experiments.bench.replay                      # every run under experiments/results with lm_calls.jsonl.gz
    python -m experiments.bench.replay musique-lm60-fast    # named runs

A run that used an option since retired (`ProgramConfig.RETIRED`) is listed as old, with the
commit that reproduces it, and not rerun. Each other run is `hyperprove reproduce
experiments/results/NAME --no-track` in its own process (the
index is built into the cache dir by the first run that needs it, as on a fresh clone). It prints
a table: the run, its questions and systems, its recorded calls and their size, the seconds the
reproduction took, and whether every metric came back equal. Then two copies of the first run's
folder: one with a reply changed (results.json left as it was), one with a call removed (the
record's count and sha256 made to match), each with the one line `reproduce` stopped with.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.config import ProgramConfig, retired_on

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
RECORD_FILE = "lm_calls.jsonl.gz"


def reproduce(folder: Path, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "reproduce", str(folder), "--no-track", "--json", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    return done, time.perf_counter() - started


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1]


def tampered(folder: Path, scratch: Path, change: str) -> Path:
    """A copy of `folder` whose record has its first call's reply changed (`reply`, results.json
    left alone) or its first call removed (`removed`, the header's count and the sha256 made to match)."""
    copy = scratch / f"{folder.name}-{change}"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("pages"))
    header, first, *rest = gzip.decompress((copy / RECORD_FILE).read_bytes()).decode().splitlines()
    if change == "reply":
        call = json.loads(first)
        if call["kind"] == "chat.completion":
            call["response"]["choices"][0]["message"]["content"] += " (edited)"
        else:  # DSPy's native record: the reply's text is its first output
            call["response"]["outputs"][0] += " (edited)"
        lines = [header, json.dumps(call), *rest]
    else:
        lines = [json.dumps({**json.loads(header), "calls": len(rest)}), *rest]
    data = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    (copy / RECORD_FILE).write_bytes(data)
    if change == "removed":
        results = json.loads((copy / "results.json").read_text())
        results["lm_calls"].update(sha256=hashlib.sha256(data).hexdigest(), calls=len(rest), bytes=len(data))
        (copy / "results.json").write_text(json.dumps(results))
    return copy


def retired_options(results: dict) -> list[str]:
    """The retired options a run had on (`ProgramConfig.RETIRED`)."""
    return retired_on(ProgramConfig, results.get("config", {}).get("program", {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="names under experiments/results (default: every one with recorded LM calls)")
    args = parser.parse_args(argv)
    folders = [RESULTS / name for name in args.runs] or sorted(p.parent for p in RESULTS.glob(f"*/{RECORD_FILE}"))
    print("| run | questions | systems | recorded calls | record | reproduce (s) | metrics |")
    print("|---|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for folder in folders:
            results = json.loads((folder / "results.json").read_text())
            if retired := retired_options(results):
                print(f"| {folder.name} | {results['n_questions']} | {len(results['systems'])} | {results['lm_calls']['calls']} | "
                      f"{results['lm_calls']['bytes'] / 1e6:.2f} MB | – | old: {', '.join(retired)} retired; "
                      f"reproduces at commit {ProgramConfig.RETIRED_AT} |", flush=True)
                continue
            done, seconds = reproduce(folder, Path(scratch) / folder.name)
            if done.returncode == 0:
                verdict = "all equal" if json.loads(last_line(done.stdout))["identical"] else "differ: " + done.stdout[-400:]
            else:
                verdict = f"failed: {last_line(done.stderr)}"
            print(f"| {folder.name} | {results['n_questions']} | {len(results['systems'])} | {results['lm_calls']['calls']} | "
                  f"{results['lm_calls']['bytes'] / 1e6:.2f} MB | {seconds:.0f} | {verdict} |", flush=True)
        first = next(folder for folder in folders if not retired_options(json.loads((folder / "results.json").read_text())))
        for change in ("reply", "removed"):
            copy = tampered(first, Path(scratch), change)
            done, seconds = reproduce(copy, Path(scratch) / f"{copy.name}-out")
            print(f"{first.name} with {'its first reply changed' if change == 'reply' else 'its first call removed'}: exit {done.returncode} "
                  f"after {seconds:.0f} s: {last_line(done.stderr).replace(str(scratch), 'COPY')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
