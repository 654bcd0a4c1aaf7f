"""A throwaway PostgreSQL server for studies and runs, and the run that shows them on it.

    python -m experiments.bench.postgres            # workers, a kill, MLflow on PostgreSQL, a reproduce

`LocalPostgres` starts a real server from the Debian package's binaries (PostgreSQL 15 here: no
container) in a temporary folder, on a loopback port, trusting local connections, and removes
it on exit; as root it runs the server as the `postgres` user, which PostgreSQL requires. The
tests use it too, and skip with the reason when the binaries or the driver are missing.

The run (`main`): `--workers` `hyperprove sweep` processes on one Optuna study in the server; one
is killed (SIGKILL) in the middle of a trial, and the others take its trial up; the study ends
with exactly `--trials` finished trials, no parameter set twice. Then an `mlflow server` backed
by the same database tracks an evaluate run, and `hyperprove reproduce RUN_ID` reruns it from there.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USER = "hyperprove"


def binaries() -> Path | None:
    """The folder holding initdb and postgres, or None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def missing() -> str | None:
    """Why a PostgreSQL server cannot be started here (None when it can)."""
    if binaries() is None:
        return "no PostgreSQL server binaries (Debian: apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401 - SQLAlchemy's driver for postgresql:// URLs
    except ImportError:
        return 'no PostgreSQL driver: pip install -e ".[postgres]"'
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser to start the server as another user"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalPostgres:
    """A PostgreSQL server in a temporary folder; `url(database)` names a database in it."""

    def __init__(self):
        self.bin = binaries()
        self.folder = Path(tempfile.mkdtemp(prefix="hyperprove-pg-", dir="/tmp"))
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def _command(self, *argv: str) -> list[str]:
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            return ["runuser", "-u", "postgres", "--", *argv]
        return list(argv)

    def start(self) -> "LocalPostgres":
        data = self.folder / "data"
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        subprocess.run(self._command(str(self.bin / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8"),
                       check=True, capture_output=True)
        self.process = subprocess.Popen(
            self._command(str(self.bin / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port), "-k", str(self.folder)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        import psycopg

        for _ in range(300):
            try:
                psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres").close()
                return self
            except psycopg.OperationalError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"postgres exited with status {self.process.returncode}") from None
                time.sleep(0.1)
        raise RuntimeError("postgres did not accept connections within 30 s")

    def create(self, database: str) -> str:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres", autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{database}"')
        return self.url(database)

    def url(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "LocalPostgres":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- the run ------------------------------------------------------------------------------------------
def hyperprove(*argv, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", *map(str, argv)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **options)


def study_trials(url: str, study: str) -> list:
    import optuna

    return optuna.load_study(study_name=study, storage=url).get_trials(deepcopy=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", default="../shared/data/musique/train.json")
    parser.add_argument("--corpus", default="../shared/data/musique/corpus.json")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--trials", type=int, default=12)
    args = parser.parse_args(argv)
    if reason := missing():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    data = ["--questions", args.questions, "--corpus", args.corpus, "--limit", args.limit, "--decomposition", "gold", "--no-track"]
    with LocalPostgres() as server, tempfile.TemporaryDirectory() as scratch:
        studies, runs = server.create("studies"), server.create("runs")
        print(f"PostgreSQL at {server.url('')} ({server.bin})")
        # the index once, so that every worker starts from the cache
        subprocess.run([sys.executable, "-m", "pipeline.cli", "evaluate", *map(str, data), "--limit", "1", "--retriever", "hyperprove",
                        "--out", f"{scratch}/warm"], cwd=ROOT, check=True, capture_output=True)
        started = time.perf_counter()
        workers = [hyperprove("sweep", *data, "--trials", args.trials, "--storage", studies, "--study", "pg", "--out", f"{scratch}/sweep{k}")
                   for k in range(args.workers)]
        killed = None
        while killed is None and time.perf_counter() - started < 600:  # kill the first worker in the middle of a trial
            running = [t for t in study_trials(studies, "pg") if t.state.name == "RUNNING"] if _exists(studies) else []
            mine = [t for t in running if (t.user_attrs.get("hyperprove.worker") or {}).get("pid") == workers[0].pid]
            if mine:
                workers[0].kill()
                killed = mine[0].number
            time.sleep(0.2)
        for worker in workers:
            worker.wait()
        seconds = time.perf_counter() - started
        trials = study_trials(studies, "pg")
        finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
        params = [json.dumps(t.params, sort_keys=True) for t in finished]
        lost = next((t for t in trials if t.number == killed), None)
        again = [t.number for t in finished if lost is not None and t.params == (lost.params or lost.system_attrs.get("fixed_params"))]
        print("| workers | asked trials | finished | distinct parameter sets | killed trial | its parameters finished by | seconds |")
        print("|---:|---:|---:|---:|---|---|---:|")
        print(f"| {args.workers} | {args.trials} | {len(finished)} | {len(set(params))} | {killed} ({lost.state.name if lost else '-'}) "
              f"| trial {', '.join(map(str, again)) or '-'} | {seconds:.0f} |")
        # MLflow on the same server: an evaluate run tracked there, then reproduced from its id
        port = free_port()
        mlflow = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", runs, "--default-artifact-root",
                                   Path(scratch, "artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            uri = f"http://127.0.0.1:{port}"
            wait_for_mlflow(uri)
            tracked = [a for a in data if a != "--no-track"]
            done = subprocess.run([sys.executable, "-m", "pipeline.cli", "evaluate", *map(str, tracked), "--retriever", "dense,hyperprove",
                                   "--tracking-uri", uri, "--out", f"{scratch}/run", "--no-trace", "--json"], cwd=ROOT, capture_output=True, text=True)
            run_id = json.loads(done.stdout.strip().splitlines()[-1])["mlflow_run"]
            again = subprocess.run([sys.executable, "-m", "pipeline.cli", "reproduce", run_id, "--tracking-uri", uri, "--out", f"{scratch}/again",
                                    "--json"], cwd=ROOT, capture_output=True, text=True)
            outcome = json.loads(again.stdout.strip().splitlines()[-1])
            print(f"MLflow on PostgreSQL: evaluate run {run_id}; reproduce RUN_ID: identical={outcome['identical']}")
        finally:
            os.killpg(mlflow.pid, signal.SIGTERM)
            mlflow.wait()
    return 0


def _exists(url: str) -> bool:
    import optuna

    return "pg" in optuna.get_all_study_names(storage=url)


def wait_for_mlflow(uri: str) -> None:
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the MLflow server at {uri} did not answer")


if __name__ == "__main__":
    sys.exit(main())
