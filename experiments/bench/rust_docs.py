"""The Rust documentation the installed toolchain ships, indexed as a user would index it: one
`hyperprove index` command, timed, with its peak memory, its size on disk, and optionally a kill
part-way and a resume, compared byte for byte with an uninterrupted build.

    python -m experiments.bench.rust_docs --out runs/rust                     # the whole folder
    python -m experiments.bench.rust_docs --out runs/rust --under std/env     # a part of it
    python -m experiments.bench.rust_docs --out runs/rust --under std/env --kill-after 60
    python -m experiments.bench.rust_docs --out runs/rust --ray               # batches on a local Ray cluster
    python -m experiments.bench.rust_docs --out runs/rust --under std --change    # then a page changed and deleted
    python -m experiments.bench.rust_docs --out runs/rust --resume            # go on with a build that was stopped

The folder is the one holding the `index.html` that `rustup doc --path` prints (the std, core and
alloc API pages, the books, the reference: about 33,000 pages over 2 KB; MIT OR Apache-2.0); `--docs`
names another. Where there is none, the script says so and exits with 2. `--kill-after S` kills
the build (SIGKILL) S seconds in, runs the same command again, then builds the folder once more
without a kill into another folder, and reports whether the two indexes' files are equal.
`--change` indexes a copy of the folder (OUT/docs), then adds a sentence to one page and brings
the index up to date (`index --add OUT/docs --into OUT/index`), then deletes that page
(`index --delete PAGE --into OUT/index`), each timed; last (unless `--no-rebuild`) it builds the
folder without the page afresh and reports whether both indexes hold the same passages (title,
text, source), facts and entity names. `--resume` keeps what an earlier run of the same command
left in OUT (its batch checkpoints, its copy of the folder) and goes on; the seconds reported are
then this run's plus, for each earlier run, the time from its start to the last checkpoint or
cache entry it wrote (the work after that was lost and is done again here), each listed under
"attempts".
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
    parser.add_argument("--change", action="store_true", help="index a copy, then change a page and delete it, timed")
    parser.add_argument("--no-rebuild", action="store_true", help="--change: no fresh build to compare with (the whole folder: hours)")
    parser.add_argument("--resume", action="store_true", help="go on from what an earlier run of this command left in --out")
    args = parser.parse_args(argv)
    if args.resume and args.kill_after:
        parser.error("--resume goes on with one build; --kill-after makes two")
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
    earlier = attempts(out) if args.resume else []
    kept = ("index.building", "index.cache", "docs") if earlier else ()
    for stale in (out / "index", out / "whole", out / "fresh", out / "docs"):
        for path in (stale, stale.with_name(f"{stale.name}.building"), stale.with_name(f"{stale.name}.cache")):
            if path.name not in kept:
                shutil.rmtree(path, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    (out / "attempts.json").write_text(json.dumps([*earlier, {"started": started}]))
    if args.change:
        if not (out / "docs").is_dir():
            shutil.copytree(folder, out / "docs.copying", dirs_exist_ok=True)
            (out / "docs.copying").rename(out / "docs")
        folder = out / "docs"
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
    spent = [*earlier, {"started": started, "seconds": run["seconds"]}]
    seconds = round(sum(attempt["seconds"] for attempt in spent), 1)
    report.update(files=built["files"], skipped=built["skipped"], passages=built["passages"], facts=built["facts"],
                  entities=built["entities"], seconds=seconds, attempts=spent, peak_rss_gib=built["peak_rss_gib"],
                  index_gib=round(size_on_disk(out / "index"), 2))
    print(f"{built['files']} files ({built['skipped']} skipped): {built['passages']} passages, {built['facts']} facts, "
          f"{built['entities']} entities in {seconds} s" + (f" ({len(spent)} runs: {', '.join(str(a['seconds']) for a in spent)} s)" if earlier else "")
          + f"; peak RSS {built['peak_rss_gib']} GiB; index {report['index_gib']} GiB on disk")
    if args.kill_after:
        whole = timed(index_command(folder, out / "whole", extra))
        report["resumed_equals_uninterrupted"] = whole["summary"] is not None and index_files(out / "index") == index_files(out / "whole")
        report["uninterrupted_seconds"] = whole["seconds"]
        print(f"resumed index equal, file for file, to an uninterrupted build ({whole['seconds']} s): {report['resumed_equals_uninterrupted']}")
    if args.change:
        report["change"] = change_a_page(folder, out, extra, rebuild=not args.no_rebuild)
    print(json.dumps(report))
    return 0


def attempts(out: Path) -> list[dict]:
    """The earlier runs of a resumed build, each {"started", "seconds"}: the seconds from its start
    to the last thing it wrote that a resume uses (a batch checkpoint, or an embedding or a parsed
    document in the build's cache folder; none: 0)."""
    try:
        runs = json.loads((out / "attempts.json").read_text())
    except (OSError, ValueError):
        return []
    kept = [*(out / "index.building").glob("*/part.json"), *(path for path in (out / "index.cache").rglob("*") if path.is_file())]
    written = sorted(path.stat().st_mtime for path in kept)
    ends = [run["started"] for run in runs[1:]] + [float("inf")]
    return [{"started": run["started"], "seconds": run.get("seconds")
             or round(max([t for t in written if run["started"] <= t < end], default=run["started"]) - run["started"], 1)}
            for run, end in zip(runs, ends)]


def change_a_page(folder: Path, out: Path, extra: list[str], rebuild: bool) -> dict:
    """The first rustdoc page over 2 KB gains a sentence, the index is brought up to date; then
    the page is deleted from the index; each timed. With `rebuild`, the folder without the page
    is built afresh and compared with the changed index."""
    page = next(path for path in sorted(folder.rglob("*.html")) if path.stat().st_size > 2048 and b"</main>" in path.read_bytes())
    page.write_bytes(page.read_bytes().replace(b"</main>", b"<p>HyperProve's benchmark added this sentence to the page.</p></main>", 1))
    cache = ["--cache-dir", f"{out / 'index'}.cache"]  # the build's: its parsed documents are what an update reads
    added = timed([sys.executable, "-m", "pipeline.cli", "index", "--add", str(folder), "--into", str(out / "index"), "--json", *cache])
    deleted = timed([sys.executable, "-m", "pipeline.cli", "index", "--delete", str(page), "--into", str(out / "index"), "--json", *cache])
    if added["summary"] is None or deleted["summary"] is None:
        raise SystemExit(f"the change failed (exit {added['code']}, {deleted['code']})")
    row = {"page": str(page.relative_to(folder)), **{f"{name}_{key}": result["summary"][key] for name, result in (("add", added), ("delete", deleted))
                                                    for key in ("added", "removed", "seconds") if key in result["summary"]},
           "add_command_seconds": added["seconds"], "delete_command_seconds": deleted["seconds"]}
    print(f"{row['page']}: a sentence added, index brought up to date in {row['add_seconds']} s ({added['seconds']} s the command); "
          f"the page deleted in {row['delete_seconds']} s ({deleted['seconds']} s the command)", flush=True)
    if rebuild:
        page.unlink()
        fresh = timed(index_command(folder, out / "fresh", extra))
        row["equals_fresh_build"] = fresh["summary"] is not None and same_content(out / "index", out / "fresh")
        print(f"equal to a fresh build of the folder without the page: {row['equals_fresh_build']}")
    return row


def same_content(ours: Path, theirs: Path) -> bool:
    """Both indexes hold the same passages (title, text, source), facts and entity names (ids and
    order may differ: a changed index keeps its passages' ids)."""
    from collections import Counter

    from pipeline.index.store import load_index

    a, b = load_index(ours), load_index(theirs)
    return (sorted((p.title, p.text, p.source) for p in a.passages) == sorted((p.title, p.text, p.source) for p in b.passages)
            and Counter(a.fact_text) == Counter(b.fact_text) and set(a.entity_names) == set(b.entity_names))


if __name__ == "__main__":
    sys.exit(main())
