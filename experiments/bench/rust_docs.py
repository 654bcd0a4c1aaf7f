"""The Rust documentation the installed toolchain ships, indexed as a user would index it: one
`hyperprove index` command, timed, with its peak memory, its size on disk, and optionally a kill
part-way and a resume, compared byte for byte with an uninterrupted build.

    python -m experiments.bench.rust_docs --out runs/rust                     # the whole folder
    python -m experiments.bench.rust_docs --out runs/rust --under std/env     # a part of it
    python -m experiments.bench.rust_docs --out runs/rust --under std/env --kill-after 60
    python -m experiments.bench.rust_docs --out runs/rust --ray               # batches on a local Ray cluster

The folder is the one holding the `index.html` that `rustup doc --path` prints (the std, core and
alloc API pages, the books, the reference: about 33,000 pages over 2 KB; MIT OR Apache-2.0); `--docs`
names another. Where there is none, the script says so and exits with 2. `--kill-after S` kills
the build (SIGKILL) S seconds in, runs the same command again, then builds the folder once more
without a kill into another folder, and reports whether the two indexes' files are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rust_docs() -> Path | None:
    """The toolchain's documentation folder, or None where rustup or its docs are missing."""
    try:
        printed = subprocess.run(["rustup", "doc", "--path"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    folder = Path(printed).parent if printed else None
    return folder if folder and folder.is_dir() else None


def index_command(folder: Path, out: Path, extra: list[str]) -> list[str]:
    """`hyperprove index` into `out`, with a cache folder of its own beside it (an embedding
    cache shared between two builds would hand the second the first one's vectors)."""
    return [sys.executable, "-m", "pipeline.cli", "index", str(folder), "--out", str(out), "--cache-dir", f"{out}.cache", "--json", *extra]


def timed(command: list[str], kill_after: float | None = None) -> dict:
    """Run `command` (killed after `kill_after` s where given): its seconds, exit code and JSON
    summary (its last line, with the command's own peak resident memory; Ray workers are
    processes of their own, not counted there)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
    seconds = time.perf_counter() - started
    lines = out.strip().splitlines()
    summary = json.loads(lines[-1]) if process.returncode == 0 and lines else None
    return {"seconds": round(seconds, 1), "code": process.returncode, "summary": summary,
            "lines": [line for line in lines[:-1] if "resuming" in line or "files," in line or "batches" in line]}


def size_on_disk(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**30


def index_files(folder: Path) -> dict:
    return {name: entry["sha256"] for name, entry in json.loads((folder / "manifest.json").read_text())["files"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/rust", help="where the index (index/) and a second one for --kill-after (whole/) go")
    parser.add_argument("--docs", help="the documentation folder (default: the one `rustup doc --path` names)")
    parser.add_argument("--under", help="index only this part of the folder (say std/env)")
    parser.add_argument("--kill-after", type=float, help="kill the build this many seconds in, resume it, and compare with an uninterrupted one")
    parser.add_argument("--ray", action="store_true", help="the batches on a Ray cluster started by the command (--ray local)")
    parser.add_argument("--batch-files", type=int, help="files a batch (default: the index config's)")
    args = parser.parse_args(argv)
    docs = Path(args.docs) if args.docs else rust_docs()
    if docs is None:
        print("no Rust documentation here: `rustup doc --path` names none (rustup component add rust-docs installs it), "
              "or pass --docs FOLDER", file=sys.stderr)
        return 2
    folder = docs / args.under if args.under else docs
    if not folder.is_dir():
        print(f"{folder}: not a folder", file=sys.stderr)
        return 2
    out = Path(args.out)
    extra = [*(["--ray", "local"] if args.ray else []), *(["--batch-files", str(args.batch_files)] if args.batch_files else [])]
    pages = sum(1 for path in folder.rglob("*.html") if path.stat().st_size > 2048)
    print(f"{folder}: {pages} HTML pages over 2 KB", flush=True)
    for stale in (out / "index", out / "whole"):
        for path in (stale, stale.with_name(f"{stale.name}.building"), stale.with_name(f"{stale.name}.cache")):
            shutil.rmtree(path, ignore_errors=True)
    report = {"folder": str(folder), "pages_over_2kb": pages, "ray": args.ray}
    if args.kill_after:
        killed = timed(index_command(folder, out / "index", extra), kill_after=args.kill_after)
        finished = len(list((out / "index.building").glob("0*"))) if (out / "index.building").is_dir() else 0
        print(f"killed after {killed['seconds']} s (exit {killed['code']}), {finished} batches checkpointed", flush=True)
        report["killed"] = {"seconds": killed["seconds"], "batches_checkpointed": finished}
    run = timed(index_command(folder, out / "index", extra))
    if run["summary"] is None:
        print(f"the index command failed (exit {run['code']})", file=sys.stderr)
        return 1
    built = run["summary"]
    for line in run["lines"]:
        print(line)
    report.update(files=built["files"], skipped=built["skipped"], passages=built["passages"], facts=built["facts"],
                  entities=built["entities"], seconds=run["seconds"], peak_rss_gib=built["peak_rss_gib"],
                  index_gib=round(size_on_disk(out / "index"), 2))
    print(f"{built['files']} files ({built['skipped']} skipped): {built['passages']} passages, {built['facts']} facts, "
          f"{built['entities']} entities in {run['seconds']} s; peak RSS {built['peak_rss_gib']} GiB; index {report['index_gib']} GiB on disk")
    if args.kill_after:
        whole = timed(index_command(folder, out / "whole", extra))
        report["resumed_equals_uninterrupted"] = whole["summary"] is not None and index_files(out / "index") == index_files(out / "whole")
        report["uninterrupted_seconds"] = whole["seconds"]
        print(f"resumed index equal, file for file, to an uninterrupted build ({whole['seconds']} s): {report['resumed_equals_uninterrupted']}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
