"""Questions a minute from `hyperprove serve` on the embedded model with 1, 2 and 4 questions in flight.

    python -m experiments.bench.served --index IDX --questions Q.json [--ask 12] [--in-flight 1,2,4] [--out DIR] [-- SERVE ARGS]

Per count k: a fresh `hyperprove serve IDX --lm-threads k` (k llama.cpp slots batched together,
k answer slots) with an empty LM cache under `--out`, one question asked and answered first (the
model's load and each step's first prompt, not timed), then the first `--ask` questions of the file
asked by k clients at once, each sending its next question as its last is answered. It reports the
wall seconds of those questions, questions a minute, each question's seconds (p50), and how many
answers and chains differ from the first count's: slots that share a batch may compute a token
otherwise than one slot alone. Arguments after `--` go to serve (`--pin-prefixes`). Nothing else
should run on the cores. Writes OUT/served.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from experiments.bench.first_answer import ask, cli, free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]


def chain_of(record: dict) -> list[tuple[str, str]]:
    return [(hop.get("query"), hop.get("answer")) for hop in record.get("chain") or []]


def served(index: Path, questions: list[str], warm_up: str, in_flight: int, out: Path, passed: list[str]) -> dict:
    """One serve with `in_flight` slots: its answers and the seconds they took."""
    cache = out / f"cache-{in_flight}"
    shutil.rmtree(cache, ignore_errors=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    command = cli("serve", str(index), "--port", str(port), "--no-track", "--cache-dir", str(cache), "--lm-threads", str(in_flight), *passed)
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(out / f"serve-{in_flight}.log").open("w"))
    try:
        wait_ready(url, server)
        ask(url, warm_up)
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=in_flight) as clients:
            answered = list(clients.map(lambda question: ask(url, question), questions))
        wall = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=60)
    seconds = sorted(taken for _, taken in answered)
    return {"in_flight": in_flight, "questions": len(questions), "wall_seconds": round(wall, 1),
            "questions_a_minute": round(60 * len(questions) / wall, 2), "question_seconds_p50": round(seconds[len(seconds) // 2], 1),
            "answers": [record.get("answer") for record, _ in answered], "chains": [chain_of(record) for record, _ in answered]}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passed = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True, help="an index folder (`hyperprove index`)")
    parser.add_argument("--questions", required=True, help='questions file: a list of {"question", ...}')
    parser.add_argument("--ask", type=int, default=12, help="questions timed per count (one more is asked first, untimed)")
    parser.add_argument("--in-flight", default="1,2,4", help="comma-separated counts of questions in flight")
    parser.add_argument("--out", default="runs/served", help="where the caches, serve logs and served.json go")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    counts = [int(part) for part in args.in_flight.split(",") if part.strip()]
    listed = [item["question"] for item in json.loads(Path(args.questions).read_text())]
    if len(listed) < args.ask + 1:
        parser.error(f"{args.questions} holds {len(listed)} questions; --ask {args.ask} needs {args.ask + 1}")
    questions, warm_up = listed[: args.ask], listed[args.ask]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for count in counts:
        runs.append(served(Path(args.index), questions, warm_up, count, out, passed))
        first = runs[0]
        run = runs[-1]
        run["answers_differing"] = sum(a != b for a, b in zip(run["answers"], first["answers"]))
        run["chains_differing"] = sum(a != b for a, b in zip(run["chains"], first["chains"]))
        print(f"{count} in flight: {run['questions']} questions in {run['wall_seconds']} s, {run['questions_a_minute']} a minute, "
              f"p50 {run['question_seconds_p50']} s a question; against {first['in_flight']} in flight, "
              f"{run['answers_differing']} answers and {run['chains_differing']} chains differ", flush=True)
    (out / "served.json").write_text(json.dumps({"index": args.index, "passed": passed, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
