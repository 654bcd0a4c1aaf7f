"""Fault injection: kill index builds, evaluations, sweeps, index additions and deletions at
random points and check that nothing is lost.

    python -m experiments.bench.faults --runs 25 --work /tmp/hyperprove-faults      # about 15 minutes on 2 cores
    python -m experiments.bench.faults --runs 10 --jobs add                          # `index --add` alone
    python -m experiments.bench.faults --runs 10 --jobs delete                       # `index --delete` alone
    python -m experiments.bench.faults --runs 20 --jobs together                     # concurrent writers into one index

Each run starts one `hyperprove` command (an index build, an evaluation with the index cache
cold or warm, a tracked sweep, `index --add` growing an index of MuSiQue's first half by its
second half, or `index --delete` taking 10% of the passages out of an index of the whole corpus), sends it SIGINT or SIGKILL after a random delay within the length of an
uninterrupted run, and checks:

1. right after the kill, the command's output (index folder, results folder, sweep summary) is
   byte-identical to what was there before, or complete and equal to an uninterrupted run's;
2. after the same command is run again, no scratch (`.NAME.tmp-PID`, `.NAME.old-PID`) is left
   anywhere in the work folder and no MLflow run is left RUNNING;
3. the resumed command's result equals the uninterrupted run's: the same index files, the same
   metrics, the same sweep trials (parameters and values) and the same best parameters.

The `together` job kills nothing: each run starts two writers into one index at once, two
`index --add`s of different batches or an `--add` with a `--delete` (the second 0-0.5 s after the
first, alternating), and checks that both exit 0, that the index loads and holds every passage
of the first half but the deleted ones plus every added one, each id once and none given twice,
and that its generation went up by two.

It prints one line per run and a summary (runs, kills, violations; the last must be 0), and
writes them as JSON to `--work`/faults.json. MuSiQue (1,749 passages) with the real embedder,
gold sub-questions, no LM.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.index.corpus import load_corpus

ROOT = Path(__file__).resolve().parents[2]

SCRATCH = re.compile(r"^\.[^/]+\.(tmp|old)-\d+$")
TIMING = ("seconds_per_question", "retrieval_ms_per_question")


def snapshot(directory: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `directory` ({} when it does not exist)."""

    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.rglob("*")) if p.is_file()}


def interruptible() -> None:
    """In the child, before exec: SIGINT back to its default, so that Python turns it into
    KeyboardInterrupt even when this script runs in the background (where the shell ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def scratch_left(work: Path) -> list[str]:
    return [str(p) for p in work.rglob(".*") if SCRATCH.match(p.name)]


class Jobs:
    """The three commands under test, their reference (uninterrupted) results and their checks."""

    def __init__(self, work: Path, data: Path, python: str):
        self.work, self.data, self.python = work, data, python
        self.cache = work / "cache"
        self.uri = f"sqlite:///{work}/mlflow.db"
        self.reference: dict[str, object] = {}
        self.sweeps = 0

    def command(self, kind: str, study: str | None = None) -> list[str]:
        base = [self.python, "-m", "pipeline.cli"]
        corpus = str(self.data / "musique" / "corpus.json")
        if kind == "index":
            return [*base, "index", corpus, "--out", str(self.work / "index"), "--cache-dir", str(self.cache)]
        if kind == "half":  # the index that `add` grows: the first half of the corpus
            return [*base, "index", str(self.work / "first-half.json"), "--out", str(self.work / "half"), "--cache-dir", str(self.cache)]
        if kind == "whole":  # the index that `delete` shrinks
            return [*base, "index", corpus, "--out", str(self.work / "whole"), "--cache-dir", str(self.cache)]
        if kind == "add":
            return [*base, "index", "--add", str(self.work / "second-half.json"), "--into", str(self.work / "grown"), "--cache-dir", str(self.cache)]
        if kind == "delete":
            return [*base, "index", "--delete", str(self.work / "deletions.json"), "--into", str(self.work / "shrunk"), "--cache-dir", str(self.cache)]
        if kind == "evaluate":
            return [*base, "evaluate", "--questions", str(self.data / "musique" / "dev.json"), "--corpus", corpus, "--limit", "20",
                    "--retriever", "dense,ppr,hyperprove-fixed,hyperprove", "--cache-dir", str(self.cache),
                    "--out", str(self.work / "results"), "--tracking-uri", self.uri]
        return [*base, "sweep", "--questions", str(self.data / "musique" / "train.json"), "--corpus", corpus, "--limit", "10",
                "--trials", "6", "--storage", f"sqlite:///{self.work}/optuna.db", "--study", study, "--cache-dir", str(self.cache),
                "--out", str(self.work / "sweep"), "--best-out", str(self.work / "sweep" / "best.json"), "--tracking-uri", self.uri]

    def output(self, kind: str) -> Path:
        return self.work / {"index": "index", "add": "grown", "delete": "shrunk", "evaluate": "results", "sweep": "sweep"}[kind]

    def prepare(self, kind: str) -> None:
        """Before each `add` or `delete`: the index it changes, as built."""
        if kind in ("add", "delete"):
            shutil.rmtree(self.output(kind), ignore_errors=True)
            shutil.copytree(self.work / {"add": "half", "delete": "whole"}[kind], self.output(kind))

    def result(self, kind: str, study: str | None = None):
        """What an uninterrupted run must equal (timings and run ids left out)."""
        if kind in ("index", "add", "delete"):
            return snapshot(self.output(kind))
        if kind == "evaluate":
            systems = json.loads((self.output(kind) / "results.json").read_text())["systems"]
            return {name: {k: v for k, v in summary.items() if k not in TIMING} for name, summary in systems.items()}
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        trials = optuna.load_study(study_name=study, storage=f"sqlite:///{self.work}/optuna.db").trials
        summary = json.loads((self.output(kind) / "sweep.json").read_text())
        return {"trials": [(t.params, t.value) for t in trials if t.value is not None],
                "best": (summary["best_params"], summary["best_scores"]), "start": summary["start_scores"]}

    def complete(self, kind: str) -> bool:
        """The output after a kill, when it is not the previous one: is it whole and right?"""
        try:
            if kind in ("index", "add", "delete"):
                from pipeline.index.store import load_index

                load_index(self.output(kind))
                return snapshot(self.output(kind)) == self.reference[kind]
            if kind == "evaluate":
                return self.result(kind) == self.reference["evaluate"]
            summary = json.loads((self.output(kind) / "sweep.json").read_text())
            return {"sweep.json", "best.json"} <= set(snapshot(self.output(kind))) and bool(summary["best_params"])
        except Exception:  # noqa: BLE001 - anything unreadable is incomplete
            return False

    def together(self, number: int, rng: random.Random) -> tuple[list[str], int]:
        """Two writers into one index at once (see the module docstring); the problems found, and
        how many writers waited for the other."""
        from pipeline.index.store import load_index

        target = self.work / "together"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(self.work / "half", target)
        base = load_index(target)
        pair = ["north", "south"] if number % 2 == 0 else ["north", "delete"]
        commands = [[self.python, "-m", "pipeline.cli", "index", *(["--delete", str(self.work / "half-deletions.json")] if name == "delete"
                     else ["--add", str(self.work / f"{name}.json")]), "--into", str(target), "--cache-dir", str(self.cache)] for name in pair]
        first = subprocess.Popen(commands[0], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.0, 0.5))
        second = subprocess.Popen(commands[1], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        outputs = [p.communicate() for p in (first, second)]
        problems = [f"{name} exited {p.returncode}: {err.strip().splitlines()[-1:]}"
                    for name, p, (_, err) in zip(pair, (first, second), outputs) if p.returncode != 0]
        waited = sum("waiting for it to finish" in out for out, _ in outputs)
        try:
            index = load_index(target)
        except Exception as error:  # noqa: BLE001 - a damaged index is the finding
            return problems + [f"the index does not load: {error}"], waited
        deleted = set(json.loads((self.work / "half-deletions.json").read_text())) if "delete" in pair else set()
        expected = {(p.title, p.text) for k, p in enumerate(base.passages) if int(base.passage_ids[k]) not in deleted}
        for name in pair:
            if name != "delete":
                expected |= {(p.title, p.text) for p in load_corpus(self.work / f"{name}.json")}
        held = {(p.title, p.text) for p in index.passages}
        ids = index.passage_ids.tolist()
        if held != expected:
            problems.append(f"{len(expected - held)} passages lost, {len(held - expected)} unexpected")
        if len(set(ids)) != len(ids) or set(ids) & deleted or index.generation != base.generation + 2:
            problems.append(f"ids repeated or reused, or generation {index.generation} (expected {base.generation + 2})")
        return problems, waited

    def run(self, kind: str, study: str | None = None, timeout: float = 900) -> tuple[int, float]:
        started = time.perf_counter()
        done = subprocess.run(self.command(kind, study), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{kind} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
        return done.returncode, time.perf_counter() - started

    def running_mlflow_runs(self) -> int:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        return sum(len(client.search_runs([e.experiment_id], "attributes.status = 'RUNNING'")) for e in client.search_experiments())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--work", default="/tmp/hyperprove-faults")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", default="index,evaluate-cold,evaluate,sweep,add,delete",
                        help="the commands to kill, in turn (index, evaluate-cold, evaluate, sweep, add, delete), or together")
    args = parser.parse_args(argv)
    kinds = args.jobs.split(",")
    for name, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                        "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(name, value)
    work = Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    jobs = Jobs(work, Path(args.data).resolve(), sys.executable)
    rng = random.Random(args.seed)

    # `add` grows an index of the corpus's first half by its second half.
    passages = json.loads((jobs.data / "musique" / "corpus.json").read_text())
    (work / "first-half.json").write_text(json.dumps(passages[: len(passages) // 2]))
    (work / "second-half.json").write_text(json.dumps(passages[len(passages) // 2 :]))
    (work / "deletions.json").write_text(json.dumps(sorted(random.Random(1).sample(range(len(passages)), len(passages) // 10))))
    if "together" in kinds:  # two batches of the second half, and 10% of the first half's ids
        half = passages[len(passages) // 2 :]
        (work / "north.json").write_text(json.dumps(half[:50]))
        (work / "south.json").write_text(json.dumps(half[50:100]))
        (work / "half-deletions.json").write_text(json.dumps(sorted(random.Random(2).sample(range(len(passages) // 2), len(passages) // 20))))
    if "add" in kinds or "together" in kinds:
        jobs.run("half")
    if "delete" in kinds:
        jobs.run("whole")
    # References: each command uninterrupted, twice: the first fills the caches (embeddings, the
    # index cache) and gives the result to match, the second the length of a run the kills fall in.
    seconds = {}
    for kind in dict.fromkeys(label.split("-")[0] for label in kinds if label != "together"):
        jobs.prepare(kind)
        jobs.run(kind, "reference")
        jobs.reference[kind] = jobs.result(kind, "reference")
        jobs.prepare(kind)
        _, seconds[kind] = jobs.run(kind, "timing")
        if jobs.result(kind, "timing") != jobs.reference[kind]:
            raise RuntimeError(f"two uninterrupted {kind} runs differ: nothing to compare the resumed ones with")
        print(f"reference {kind}: {seconds[kind]:.1f} s with warm caches", flush=True)
    shutil.rmtree(jobs.output("sweep"), ignore_errors=True)

    records, violations = [], 0
    for number in range(args.runs):
        label = kinds[number % len(kinds)]
        if label == "together":
            started = time.perf_counter()
            problems, waited = jobs.together(number, rng)
            violations += bool(problems)
            records.append({"run": number, "job": label, "writers": "add+add" if number % 2 == 0 else "add+delete", "killed": False,
                            "exit": 0, "output_after_kill": "together", "seconds": round(time.perf_counter() - started, 1),
                            "waited": waited, "problems": problems})
            print(f"run {number:2d} together      {records[-1]['writers']:10s}: {records[-1]['seconds']:.1f} s, "
                  f"{'one writer waited for the other' if waited else 'no wait (one had finished)'}"
                  + (f"; PROBLEMS: {problems}" if problems else "; both changes in the index, nothing lost"), flush=True)
            continue
        kind = label.split("-")[0]
        study = f"faults-{number}" if kind == "sweep" else None
        if label == "evaluate-cold":  # the kill may land in the cached index's build
            shutil.rmtree(jobs.cache / "indexes", ignore_errors=True)
        jobs.prepare(kind)
        before = snapshot(jobs.output(kind))
        sig = rng.choice([signal.SIGINT, signal.SIGKILL])
        delay = rng.uniform(0.3, seconds[kind])
        process = subprocess.Popen(jobs.command(kind, study), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=interruptible)
        time.sleep(delay)
        killed = process.poll() is None
        if killed:
            os.killpg(process.pid, sig)
        code = process.wait()
        after, complete = snapshot(jobs.output(kind)), jobs.complete(kind)
        if complete and (code == 0 or after != before):
            state = "complete"  # it finished, or left a new output that is whole
        elif after == before:
            state = "previous"
        else:
            state = "BROKEN"
        problems = []
        if state == "BROKEN":
            problems.append("the output is neither the previous one nor complete")
        if code == 0 and not complete:  # exit 0 after a signal is fine only when the work was done (a signal during shutdown)
            problems.append(f"exit 0 after {signal.Signals(sig).name}, but the output is not complete")
        _, resumed_seconds = jobs.run(kind, study)
        if scratch_left(work):
            problems.append(f"scratch left: {scratch_left(work)[:3]}")
        if jobs.running_mlflow_runs():
            problems.append(f"{jobs.running_mlflow_runs()} MLflow runs left RUNNING")
        if jobs.result(kind, study) != jobs.reference[kind]:
            problems.append("the resumed result differs from the uninterrupted one")
        violations += bool(problems)
        record = {"run": number, "job": label, "signal": signal.Signals(sig).name, "after_s": round(delay, 2), "killed": killed,
                  "exit": code, "output_after_kill": state, "resume_s": round(resumed_seconds, 1), "problems": problems}
        records.append(record)
        print(f"run {number:2d} {label:13s} {record['signal']:7s} at {delay:5.1f} s: "
              f"{'signalled' if killed else 'had finished'} (exit {code}), output {state}; resumed in {resumed_seconds:.1f} s"
              + (f"; PROBLEMS: {problems}" if problems else ""), flush=True)
    summary = {"runs": len(records), "kills": sum(r["killed"] and r["exit"] != 0 for r in records),
               "signal_during_shutdown": sum(r["killed"] and r["exit"] == 0 for r in records),
               "sigint": sum(r["killed"] and r["exit"] != 0 and r["signal"] == "SIGINT" for r in records),
               "sigkill": sum(r["killed"] and r["exit"] != 0 and r["signal"] == "SIGKILL" for r in records),
               "output_previous": sum(r["output_after_kill"] == "previous" for r in records),
               "output_complete": sum(r["output_after_kill"] == "complete" for r in records),
               "writers_together": sum(r["job"] == "together" for r in records),
               "writers_waited": sum(r.get("waited", 0) > 0 for r in records),
               "violations": violations, "reference_seconds": {k: round(v, 1) for k, v in seconds.items()}}
    (work / "faults.json").write_text(json.dumps({"summary": summary, "runs": records}, indent=1))
    print(json.dumps(summary))
    return 0 if violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
