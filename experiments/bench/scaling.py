"""Questions per minute against Ray workers, on a local multi-node Ray cluster, against an LM
endpoint with an API's latency: a committed run's recorded calls served by
`experiments.bench.replay_server` with a delay per call.

    python -m experiments.bench.scaling                                   # 2wiki-train-defaults, 48 questions, 2 s a call
    python -m experiments.bench.scaling --run experiments/results/2wiki-train-defaults --questions 48 --delay 2 \\
        --workers 1 2 4 8 16 --nodes 4

The cluster is `ray start --head` plus `--nodes - 1` worker nodes, each a separate raylet on this
machine. Each worker count runs `hyperprove evaluate` with the run's own config on its first
`--questions` questions (the program only), `--ray` at the head, `--api-base` at the replay
server and an empty LM cache, so every call crosses HTTP. It prints one row per worker count:
questions per minute (timed from the moment every worker is ready), the ideal (workers x 60 /
the seconds a question waits on its calls), the efficiency, the seconds until the workers were
ready, and whether F1 and Recall@5 came out the same as with one worker. With `--passages CORPUS
--extraction-cache DIR` (an earlier `index CORPUS --extractor lm-entities --cache-dir DIR`), a
second table: `index --ray` of that corpus against its cached calls, passages per minute
(`--questions 0` for this table alone).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.bench.postgres import free_port
from pipeline.index.corpus import load_corpus

ROOT = Path(__file__).resolve().parents[2]
TIMING = re.compile(r"hyperprove: (\d+) questions in ([\d.]+) s on (\d+) Ray workers .* ready after ([\d.]+) s")


# Ray 2.60 clusters authenticate with a token: every node and driver of this one reads ~/.ray/auth_token
ENV = {**os.environ, "RAY_AUTH_MODE": "token"}


def ray_cli(*argv: str) -> None:
    subprocess.run([str(Path(sys.executable).with_name("ray")), *argv], check=True, capture_output=True, env=ENV)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="experiments/results/2wiki-train-defaults", help="a committed results folder with its calls")
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--delay", type=float, default=2.0, help="seconds the endpoint waits before each reply")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--nodes", type=int, default=4, help="Ray nodes on this machine (a head and nodes - 1 workers)")
    parser.add_argument("--cpus-per-node", type=int, default=4, help="logical CPUs each node offers Ray")
    parser.add_argument("--cache-dir", default=".hyperprove/cache", help="where the run's index is (or is built once)")
    parser.add_argument("--passages", help="also: a corpus whose LM extraction an earlier `index` left in --extraction-cache")
    parser.add_argument("--extraction-cache", help="the cache dir of that earlier build (its LM calls are served)")
    parser.add_argument("--extractor", default="lm-entities")
    args = parser.parse_args(argv)

    from pipeline.config import HyperProveConfig

    run = ROOT / args.run
    results = json.loads((run / "results.json").read_text())
    config = HyperProveConfig.from_record(results["config"]).to_dict()  # a setting added since: as the run went without it
    calls = results["systems"]["hyperprove"]["lm_calls_per_question"]
    server = subprocess.Popen([sys.executable, "-m", "experiments.bench.replay_server", str(run), "--port", "0", "--delay", str(args.delay)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    api_base = server.stdout.readline().split(" at ")[1].split()[0]
    port = free_port()
    ray_cli("get-auth-token", "--generate")
    ray_cli("start", "--head", "--port", str(port), "--num-cpus", str(args.cpus_per_node), "--include-dashboard=false", "--disable-usage-stats")
    try:
        for _ in range(args.nodes - 1):
            ray_cli("start", "--address", f"127.0.0.1:{port}", "--num-cpus", str(args.cpus_per_node), "--disable-usage-stats")
        print(f"replay server {api_base} ({args.delay:g} s a call, {calls:.2f} calls a question); Ray: {args.nodes} nodes x "
              f"{args.cpus_per_node} CPUs at 127.0.0.1:{port}; {args.questions} questions of {args.run}")
        print("| workers | questions/min | ideal | efficiency | workers ready (s) | F1 | R@5 | same as 1 worker |")
        print("|---:|---:|---:|---:|---:|---:|---:|---|")
        first = None
        for workers in args.workers if args.questions else []:
            with tempfile.TemporaryDirectory() as scratch:
                settings = {**config, "cluster": {"ray": f"127.0.0.1:{port}", "workers": workers},
                            "evaluation": {**config["evaluation"], "retrievers": ["hyperprove"], "limit": args.questions,
                                           "out": f"{scratch}/out"}}
                settings["lm"] = {**config["lm"], "api_base": api_base, "replay": None, "live": False}
                Path(scratch, "config.json").write_text(json.dumps(settings))
                # the index from the shared cache; LM calls into an empty one
                index = _index_folder(config, args.cache_dir)
                done = subprocess.run([sys.executable, "-m", "pipeline.cli", "evaluate", "--config", f"{scratch}/config.json",
                                       "--cache-dir", f"{scratch}/cache", "--no-track", "--json", *(["--index", index] if index else [])],
                                      cwd=ROOT, capture_output=True, text=True, env=ENV)
                if done.returncode != 0:
                    print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
                    return 1
                timing = TIMING.search(done.stdout)
                summary = json.loads(done.stdout.strip().splitlines()[-1])["retrievers"]["hyperprove"]
            n, seconds, _, ready = int(timing[1]), float(timing[2]), int(timing[3]), float(timing[4])
            rate, ideal = 60 * n / seconds, workers * 60 / (calls * args.delay)
            scores = (summary["f1"], summary["recall@5"])
            first = first or scores
            print(f"| {workers} | {rate:.1f} | {ideal:.1f} | {rate / ideal:.0%} | {ready:.1f} | {scores[0]:.2f} | {scores[1]:.2f} | "
                  f"{'yes' if scores == first else 'NO'} |", flush=True)
        if args.passages:
            passages_table(args, port)
    finally:
        ray_cli("stop", "--force")
        server.kill()
    return 0


PASSAGE_TIMING = re.compile(r"extraction: (\d+) passages in ([\d.]+) s on (\d+) Ray workers .* ready after ([\d.]+) s")


def passages_table(args, port: int) -> None:
    """`index --extractor EXTRACTOR --ray` of `--passages` against the calls an earlier build of it
    left in `--extraction-cache` (served with the same delay): passages per minute per worker count."""
    server = subprocess.Popen([sys.executable, "-m", "experiments.bench.replay_server", args.extraction_cache, "--port", "0",
                               "--delay", str(args.delay)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        api_base = server.stdout.readline().split(" at ")[1].split()[0]
        print(f"\n`index {args.passages} --extractor {args.extractor}`, its calls served at {args.delay:g} s each (one a passage)")
        print("| Ray workers | passages/min | ideal | efficiency | workers ready (s) | facts, entities, incidences | same as 1 worker |")
        print("|---:|---:|---:|---:|---:|---|---|")
        first = None
        for workers in args.workers:
            with tempfile.TemporaryDirectory() as scratch:
                done = subprocess.run([sys.executable, "-m", "pipeline.cli", "index", args.passages, "--out", f"{scratch}/index",
                                       "--extractor", args.extractor, "--ray", f"127.0.0.1:{port}", "--ray-workers", str(workers),
                                       "--api-base", api_base, "--cache-dir", f"{scratch}/cache", "--json"],
                                      cwd=ROOT, capture_output=True, text=True, env=ENV)
            timing = PASSAGE_TIMING.search(done.stdout)
            if done.returncode != 0 or timing is None:
                print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
                return
            built = json.loads(done.stdout.strip().splitlines()[-1])
            n, seconds, ready = int(timing[1]), float(timing[2]), float(timing[4])
            counts = (built["facts"], built["entities"], built["incidences"])
            first = first or counts
            rate, ideal = 60 * n / seconds, workers * 60 / args.delay
            print(f"| {workers} | {rate:.1f} | {ideal:.1f} | {rate / ideal:.0%} | {ready:.1f} | {', '.join(map(str, counts))} | "
                  f"{'yes' if counts == first else 'NO'} |", flush=True)
    finally:
        server.kill()


def _index_folder(config: dict, cache_dir: str) -> str | None:
    """The run's index in the cache dir (built by an earlier evaluate of the same corpus), if there."""
    from pipeline.config import HyperProveConfig
    from pipeline.index.store import index_key

    values = HyperProveConfig.from_dict(config)
    folder = Path(cache_dir) / "indexes" / index_key(load_corpus(values.evaluation.corpus), values)
    return str(folder.resolve()) if (folder / "manifest.json").is_file() else None


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.0f} s)")
    sys.exit(code)
