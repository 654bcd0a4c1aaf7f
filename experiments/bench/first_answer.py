"""How soon a folder of documentation answers: `hyperprove index` on it, then `hyperprove serve` from
start to its first answer and each later one, every LM call live.

    python -m experiments.bench.first_answer                      # the Cargo Book (104 pages) and 5 of its questions
    python -m experiments.bench.first_answer --folder DOCS --questions Q.json --ask 8 -- --documentation-demos
    python -m experiments.bench.first_answer --index runs/rust/index --cache-dir runs/rust/index.cache --questions Q.json

It indexes the folder into a fresh cache and index under `--out`, starts `hyperprove serve` on
that index (any arguments after `--` go to both commands), waits for /health, then asks the
first `--ask` questions of the questions file one after another through POST /ask. The first
answer carries what serve leaves until a question comes (the embedded LM's load). Nothing is
cached from an earlier run, and the cores should be otherwise idle for the seconds to mean
anything. Prints the times, each answer with its token F1, and writes them to OUT/first_answer.json.
`--index IDX` serves an index built earlier (with `--cache-dir`, the cache it was built with)
instead of building one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from experiments.metrics import f1_score

ROOT = Path(__file__).resolve().parents[2]
CARGO_BOOK = "cargo"  # the Cargo Book's folder beside the standard library's, in the toolchain's documentation
CARGO_QUESTIONS = ROOT / "experiments" / "questions" / "cargo-book.json"
READY_SECONDS = 600  # the most serve may take to load an index


def cargo_book() -> Path | None:
    """The installed toolchain's Cargo Book (`rustup doc --path` names the std docs beside it), or None."""
    try:
        found = subprocess.run(["rustup", "doc", "--path"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    folder = Path(found.stdout.strip()).parent / CARGO_BOOK
    return folder if found.returncode == 0 and folder.is_dir() else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", *args]


def wait_ready(url: str, server: subprocess.Popen) -> dict:
    """/health's reply once serve answers it; raises SystemExit when serve exits or takes too long."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"error: hyperprove serve exited with code {server.returncode} before it answered /health")
        try:
            with urllib.request.urlopen(url + "health", timeout=5) as reply:
                return json.load(reply)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    raise SystemExit(f"error: hyperprove serve did not answer /health within {READY_SECONDS} s")


def ask(url: str, question: str) -> tuple[dict, float]:
    request = urllib.request.Request(url + "ask", data=json.dumps({"question": question}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as reply:
        record = json.load(reply)
    return record, time.perf_counter() - started


def evidence(record: dict) -> list[dict]:
    """What an answer rests on: each hop's cited facts (or its top fact where it cited none), with
    the file of the passage each came from."""
    sources = {item["id"]: item.get("source") for item in record.get("sources", [])}
    cited = []
    for hop in record.get("chain") or []:
        facts = [fact for fact in hop.get("facts", []) if fact["id"] in hop.get("supporting", [])] or hop.get("facts", [])[:1]
        cited += [{"hop": hop["hop"], "title": fact["title"], "text": fact["text"], "source": sources.get(fact.get("passage"))} for fact in facts]
    return cited


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passed = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", help="a folder of documents (default: the installed toolchain's Cargo Book)")
    parser.add_argument("--questions", default=str(CARGO_QUESTIONS), help='questions file: a list of {"question", "answer", ...}')
    parser.add_argument("--ask", type=int, default=5, help="how many of its questions to ask, in order")
    parser.add_argument("--out", default="runs/first-answer", help="where the cache, the index and first_answer.json go (emptied first)")
    parser.add_argument("--index", help="serve this index, built earlier, instead of building one from --folder")
    parser.add_argument("--cache-dir", help="with --index: the cache folder it was built with (default: a new one under --out)")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    questions = json.loads(Path(args.questions).read_text())[: args.ask]
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cache = ["--cache-dir", args.cache_dir if args.index and args.cache_dir else str(out / "cache")]
    if args.index:
        index, index_seconds = Path(args.index), None
        counts = json.loads((index / "manifest.json").read_text())["counts"]
        made = {"files": None, "passages": counts.get("passages"), "facts": counts.get("facts")}
        folder = index
    else:
        folder = Path(args.folder) if args.folder else cargo_book()
        if folder is None or not folder.is_dir():
            print("the Cargo Book was not found (`rustup doc --path` names no toolchain documentation here); give --folder", file=sys.stderr)
            return 2
        index = out / "index"
        started = time.perf_counter()
        built = subprocess.run(cli("index", str(folder), "--out", str(index), "--json", *cache, *passed), cwd=ROOT,
                               capture_output=True, text=True)
        index_seconds = round(time.perf_counter() - started, 1)
        if built.returncode != 0:
            print(built.stderr.strip().splitlines()[-1] if built.stderr.strip() else "hyperprove index failed", file=sys.stderr)
            return 1
        made = json.loads(built.stdout.strip().splitlines()[-1])
        print(f"hyperprove index {folder}: {made['files']} files, {made['passages']} passages, {made['facts']} facts in {index_seconds} s",
              flush=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    started = time.perf_counter()
    server = subprocess.Popen(cli("serve", str(index), "--port", str(port), "--no-track", *cache, *passed), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=(out / "serve.log").open("w"))
    try:
        health = wait_ready(url, server)
        ready = time.perf_counter() - started
        print(f"serve: /health answered {ready:.1f} s after start (LM {health.get('lm')})", flush=True)
        asked = []
        for number, question in enumerate(questions, start=1):
            record, seconds = ask(url, question["question"])
            golds = [question["answer"], *question.get("answer_aliases", [])]
            asked.append({"question": question["question"], "answer": record.get("answer"), "gold": question["answer"],
                          "f1": round(100 * f1_score(record.get("answer") or "", golds), 1), "seconds": round(seconds, 2),
                          "hops": len(record.get("chain", [])), "lm_calls": record.get("lm_calls"), "evidence": evidence(record)})
            print(f"  {number}. {seconds:6.1f} s  F1 {asked[-1]['f1']:5.1f}  {question['question']} -> {record.get('answer')!r}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    later = sorted(item["seconds"] for item in asked[1:])
    summary = {"folder": str(folder), "files": made["files"], "passages": made["passages"], "facts": made["facts"],
               "index_seconds": index_seconds, "ready_seconds": round(ready, 1),
               "first_answer_seconds": round(ready + asked[0]["seconds"], 1) if asked else None,
               "later_answer_median_seconds": later[len(later) // 2] if later else None, "asked": asked, "passed": passed}
    (out / "first_answer.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"serve start to first answer: {summary['first_answer_seconds']} s; later answers, median {summary['later_answer_median_seconds']} s"
          f" ({len(later)})" + (f"; index built in {index_seconds} s" if index_seconds is not None else f"; index {index}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
