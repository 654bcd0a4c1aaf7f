"""Every bad input, kill and tampered record the reviews found, fed exactly as found:
each ends in one line naming the problem (exit 2) or in preserved state, never in a traceback,
a lost folder or a silently wrong record."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.bench.attacks import HangingLM, inflating_pdf, newline_record, page_tree_bomb
from experiments.bench.postgres import free_port
from modules.errors import HyperProveError
from pipeline.runtime import Runtime
from tests.support import CORPUS, QUESTIONS, HashEmbedder, one_line, run, two_hop_script


def dead_pid() -> int:
    """The id of a process that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid




def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# --- data loss -------------------------------------------------------------------------------------------
def test_index_never_replaces_a_folder_that_is_not_an_index(files, capsys):
    site = files / "site"
    site.mkdir()
    (site / "manifest.json").write_text('{"name": "my web app", "start_url": "/"}')
    (site / "index.html").write_text("<html></html>")
    before = snapshot(site)
    code, _, err = run(capsys, "index", files / "corpus.json", "--out", site, "--embedder", "test-hash")
    assert code == 2 and one_line(err) == f"--out {site}: holds 'index.html', which is not part of a HyperProve index; choose an empty or new folder"
    assert snapshot(site) == before


def test_an_earlier_index_is_replaced_but_not_with_a_stranger_beside_it(files, capsys):
    out = files / "idx"
    assert run(capsys, "index", files / "corpus.json", "--out", out, "--embedder", "test-hash")[0] == 0
    assert run(capsys, "index", files / "corpus.json", "--out", out, "--embedder", "test-hash")[0] == 0  # an index replaces an index
    (out / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "index", files / "corpus.json", "--out", out, "--embedder", "test-hash")
    assert code == 2 and "holds 'notes.txt', which is not part of a HyperProve index" in one_line(err)
    assert (out / "notes.txt").read_text() == "mine"


def test_index_refuses_its_out_before_the_build(files, capsys):
    class NoEmbedding(HashEmbedder):
        def encode(self, texts, progress=None):
            raise AssertionError("the build started")

    (files / "busy").mkdir()
    (files / "busy" / "data.csv").write_text("1,2")
    code, _, err = run(capsys, "index", files / "corpus.json", "--out", files / "busy", "--embedder", "test-hash",
                       runtime=lambda config: Runtime(config, embedder=NoEmbedding()))
    assert code == 2 and "holds 'data.csv'" in one_line(err)
    (files / "a-file").write_text("x")
    code, _, err = run(capsys, "index", files / "corpus.json", "--out", files / "a-file", "--embedder", "test-hash",
                       runtime=lambda config: Runtime(config, embedder=NoEmbedding()))
    assert code == 2 and one_line(err) == f"--out {files / 'a-file'}: is a file, not a folder for a HyperProve index"


# --- indexes that never loaded -------------------------------------------------------------------------------
def test_line_separators_inside_a_passage_survive_the_round_trip(files, capsys):
    corpus = [{"title": "Odd", "text": "One\u2028two\u2029three\x85four. Five."}, *CORPUS]
    (files / "odd.json").write_text(json.dumps(corpus))
    assert run(capsys, "index", files / "odd.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    from pipeline.index.store import load_index

    assert load_index(files / "idx").passages[0].text == "One\u2028two\u2029three\x85four. Five."


def test_a_lone_surrogate_is_named_not_a_traceback(files, capsys):
    (files / "bad.json").write_text('[{"title": "A", "text": "broken \\ud800 text"}]')
    code, _, err = run(capsys, "index", files / "bad.json", "--out", files / "idx", "--embedder", "test-hash")
    assert code == 2
    assert one_line(err) == f'{files / "bad.json"}: item 0: field "text" holds \'\\ud800\' at character 7, which is not text (a lone surrogate or a byte that is not UTF-8)'


# --- stale caches and wrong records ---------------------------------------------------------------------------
def test_the_index_cache_is_keyed_on_every_setting_that_shapes_the_index(files):
    from pipeline.config import HyperProveConfig
    from pipeline.index.corpus import load_corpus
    from pipeline.index.store import cached_index, index_key

    passages = load_corpus(files / "corpus.json")
    base = HyperProveConfig().with_overrides(index={"embedder": "test-hash"}, cache_dir=str(files / "cache"))
    keys = {index_key(passages, base.with_overrides(index={name: value}))
            for name, value in [("eta", 0.8), ("eta", 0.5), ("synonym_neighbors", 3), ("exact_search_max", 2), ("extractor", "lm")]}
    assert len(keys) == 5
    assert index_key(passages, base.with_overrides(index={"batch_size": 8})) == index_key(passages, base)  # pace, not shape
    first, _ = cached_index(passages, base, Runtime(base, embedder=HashEmbedder()), log=lambda line: None)
    changed = base.with_overrides(index={"synonym_neighbors": 3})
    second, directory = cached_index(passages, changed, Runtime(changed, embedder=HashEmbedder()), log=lambda line: None)
    assert first.info["config"]["synonym_neighbors"] == 10 and second.info["config"]["synonym_neighbors"] == 3
    assert json.loads((directory / "manifest.json").read_text())["config"]["synonym_neighbors"] == 3


def test_an_index_built_with_other_settings_is_refused_not_misrecorded(files, capsys):
    assert run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    code, _, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--index", files / "idx", "--retriever", "ppr", "--eta", "0.5", "--embedder", "test-hash", "--no-track",
                       "--out", files / "results")
    assert code == 2
    assert one_line(err) == (f"{files / 'idx'}: built with eta 0.8, but eta 0.5 was asked for; "
                             "ask for 0.8 (--eta or index.eta in the config) or rebuild the index")
    assert not (files / "results").exists()


# --- reproduce trusts nothing it should not ------------------------------------------------------------------
@pytest.fixture
def tracked(files, capsys, monkeypatch):
    """An evaluate run tracked in a store under the test's folder (the working directory), and a
    way to rewrite its logged results.json as an attacker would."""
    monkeypatch.chdir(files)
    scripted = two_hop_script(final_answer="2017")

    def runtime(config):
        from dspy.utils import DummyLM

        return Runtime(config, lm=DummyLM(scripted), embedder=HashEmbedder())

    uri = f"sqlite:///{files}/mlflow.db"
    code, out, _ = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "hyperprove,dense", "--decomposition", "lm", "--embedder", "test-hash",
                       "--cache-dir", files / "cache", "--out", files / "first", "--tracking-uri", uri, "--json", runtime=runtime)
    assert code == 0
    run_id = json.loads(out.strip().splitlines()[-1])["mlflow_run"]
    (logged,) = [p for p in (files / ".hyperprove" / "mlartifacts").rglob("results.json") if run_id in str(p)]

    def tamper(change):
        record = json.loads(logged.read_text())
        change(record)
        logged.write_text(json.dumps(record))

    return {"uri": uri, "run": run_id, "tamper": tamper, "runtime": runtime}


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/hyperprove-escaped"])
def test_reproduce_writes_only_under_the_local_results_folder(files, capsys, tracked, name):
    tracked["tamper"](lambda record: record.update(name=name))
    code, out, _ = run(capsys, "reproduce", tracked["run"], "--tracking-uri", tracked["uri"], "--json", runtime=tracked["runtime"])
    assert code == 0
    written = Path(json.loads(out.strip().splitlines()[-1])["out"])
    assert written.parent == Path(".hyperprove") / "results" and written.name.startswith("escaped-reproduce-" if ".." in name else "tmp-hyperprove-escaped-reproduce-")
    assert not (files.parent.parent / "escaped").exists() and not Path("/tmp/hyperprove-escaped").exists()
    assert "reproducing run " in out and '  evaluation: {"questions": ' in out  # the config it runs, printed first


def test_reproduce_takes_no_cache_dir_and_no_lm_endpoint_from_the_record(files, capsys, tracked):
    evil = files / "planted-cache"
    tracked["tamper"](lambda record: record["config"].update(cache_dir=str(evil)))
    code, out, _ = run(capsys, "reproduce", tracked["run"], "--tracking-uri", tracked["uri"], "--json", runtime=tracked["runtime"])
    assert code == 0 and not evil.exists() and '  cache_dir: ".hyperprove/cache"' in out

    tracked["tamper"](lambda record: record["config"]["lm"].update(model="openai/gpt-4o", api_base="http://attacker.example/v1"))
    code, _, err = run(capsys, "reproduce", tracked["run"], "--tracking-uri", tracked["uri"], runtime=tracked["runtime"])
    assert code == 2
    assert one_line(err) == (f"run {tracked['run']} names LM openai/gpt-4o at http://attacker.example/v1; reproducing it would send "
                             "every question (and your API key) there: check the record, then pass --trust-record")


def test_reproduce_refuses_a_record_without_its_config(files, capsys, tracked):
    tracked["tamper"](lambda record: record.pop("config"))
    code, _, err = run(capsys, "reproduce", tracked["run"], "--tracking-uri", tracked["uri"])
    assert code == 2 and one_line(err) == f"run {tracked['run']}: its results.json has no 'config' object (not written by `hyperprove evaluate`)"


# --- sweeps ----------------------------------------------------------------------------------------------------
def score_alpha(params, chunk):
    return [{"recall@5": 1.0 - (params["alpha"] - 0.7) ** 2, "recall@2": 0.0} for _ in chunk]


def test_a_study_refuses_another_objective_or_other_questions(tmp_path):
    from optimize.study import run_trials
    from pipeline.config import SweepConfig

    sweep = SweepConfig(trials=2, storage=f"sqlite:///{tmp_path}/o.db", study="s")
    run_trials(sweep, list(range(4)), score_alpha, progress=False, setting={"objective": "recall@5", "questions_sha256": "aa"})
    for setting, differs in (({"objective": "recall@2", "questions_sha256": "aa"}, "objective = \"recall@5\", this sweep has \"recall@2\""),
                             ({"objective": "recall@5", "questions_sha256": "bb"}, "questions_sha256 = \"aa\", this sweep has \"bb\"")):
        with pytest.raises(HyperProveError) as error:
            run_trials(SweepConfig(trials=4, storage=sweep.storage, study="s"), list(range(4)), score_alpha, progress=False, setting=setting)
        assert str(error.value) == (f"study 's' in {sweep.storage} was made with {differs}; give --study a new name, "
                                    "or run it with the study's setting")


def test_the_sweep_command_refuses_to_mix_objectives(files, capsys):
    argv = ["sweep", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--embedder", "test-hash",
            "--trials", 2, "--storage", f"sqlite:///{files}/optuna.db", "--study", "toy", "--cache-dir", files / "cache",
            "--no-track", "--out", files / "sweep", "--best-out", files / "best.json"]
    assert run(capsys, *argv)[0] == 0
    code, _, err = run(capsys, *argv, "--objective", "recall@2")
    assert code == 2 and 'was made with objective = "recall@5", this sweep has "recall@2"' in one_line(err)


def work_on_study(storage: str, results) -> None:
    """One sweep worker (a process of its own), scoring slowly so that workers overlap."""
    import time

    from optimize.study import run_trials
    from pipeline.config import SweepConfig

    def slow(params, chunk):
        time.sleep(0.2)
        return score_alpha(params, chunk)

    run_trials(SweepConfig(trials=8, storage=storage, study="shared", chunk=4), list(range(4)), slow, progress=False)
    results.put("done")


def test_workers_on_one_study_stop_at_the_trials_in_total_and_draw_different_parameters(tmp_path):
    import multiprocessing

    from optimize.study import open_study
    from pipeline.config import SweepConfig

    storage = f"sqlite:///{tmp_path}/shared.db"  # new: the workers race to create its tables
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=work_on_study, args=(storage, results)) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [results.get(timeout=1) for _ in workers] == ["done"] * 3
    study = open_study(SweepConfig(storage=storage, study="shared"))
    from optuna.trial import TrialState

    finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(finished) == 8
    assert len({t.params["alpha"] for t in finished}) == 8  # no parameter set drawn twice


def test_a_killed_workers_running_trial_is_failed_and_asked_again(tmp_path):
    import optuna

    from optimize.study import WORKER, open_study, run_trials
    from pipeline.config import SweepConfig

    sweep = SweepConfig(trials=3, storage=f"sqlite:///{tmp_path}/k.db", study="k")
    study = open_study(sweep)
    with pytest.warns(UserWarning, match="Heartbeat"):  # Optuna's note that study.optimize beats its heart, not ask()
        lost = study.ask()  # what a SIGKILL leaves: a trial RUNNING, its process gone
    lost.set_user_attr(WORKER, {"host": __import__("socket").gethostname(), "pid": dead_pid()})
    alpha = lost.suggest_float("alpha", 0.0, 1.0)
    study = run_trials(sweep, list(range(4)), score_alpha, progress=False)
    states = [t.state for t in study.trials]
    assert states[0] == optuna.trial.TrialState.FAIL and states.count(optuna.trial.TrialState.RUNNING) == 0
    assert study.trials[1].params["alpha"] == alpha  # the lost trial, asked again first
    assert sum(s in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for s in states) == 3


def test_a_worker_that_loses_the_race_to_create_the_study_tables_opens_the_storage_again(tmp_path, monkeypatch):
    """Workers started together on a new database race to create Optuna's tables; a loser sees the
    winner's tables as a unique violation (PostgreSQL) or as "table ... already exists" (SQLite)."""
    import optuna
    from sqlalchemy.exc import IntegrityError, OperationalError

    from optimize.study import open_study
    from pipeline.config import SweepConfig

    real, tries = optuna.storages.RDBStorage, []
    lost_races = [IntegrityError("CREATE TABLE studies", {}, Exception('duplicate key value violates unique constraint "pg_type_typname_nsp_index"')),
                  OperationalError("CREATE TABLE studies", {}, Exception("table studies already exists"))]

    class Racing(real):
        def __init__(self, url, **options):
            tries.append(url)
            if len(tries) <= len(lost_races):
                real(url, **options)  # the winner's tables
                raise lost_races[len(tries) - 1]
            super().__init__(url, **options)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Racing)
    study = open_study(SweepConfig(storage=f"sqlite:///{tmp_path}/race.db", study="race"))
    assert study.study_name == "race" and len(tries) == 3

    tries.clear()
    (tmp_path / "folder.db").mkdir()
    with pytest.raises(HyperProveError, match=r"^--storage sqlite:///.*/folder.db: Optuna cannot open it \(OperationalError: .*unable to open database file"):
        open_study(SweepConfig(storage=f"sqlite:///{tmp_path}/folder.db", study="race"))
    assert len(tries) == 1  # no race to wait out: said at once


def test_a_copy_of_the_starting_trial_leaves_the_seeds_of_the_trials_after_it_unchanged(tmp_path):
    """Two workers opening a new study at once both enqueue the configured parameters; the copy is
    marked surplus only when a worker runs it, and a trial that counted it before then would draw
    with the seed of the next."""
    from optimize.study import SURPLUS, draw, open_study
    from pipeline.config import SweepConfig

    study = open_study(SweepConfig(storage=f"sqlite:///{tmp_path}/s.db", study="s"))
    start = {"alpha": 0.5, "theta": 0.1, "depth": 2, "top_k": 5}
    for _ in range(2):  # each worker's "a new study starts with the configured parameters"
        study.enqueue_trial(start)
    with pytest.warns(UserWarning, match="Heartbeat"):
        first, copy, fresh = study.ask(), study.ask(), study.ask()
        seed_offset = draw(study, fresh)  # drawn while the copy is still running
        copy.set_user_attr(SURPLUS, True)  # its worker finds the first trial holds its parameters
        later, last = study.ask(), study.ask()
    assert (first.number, copy.number, fresh.number, later.number, last.number) == (0, 1, 2, 3, 4)
    assert seed_offset == draw(study, fresh) == 1  # the starting trial counts, its copy never does
    assert (draw(study, later), draw(study, last)) == (2, 3)  # not the fresh trial's seed again


def test_a_resumed_sweep_asks_what_an_uninterrupted_one_asked(tmp_path):
    from optimize.study import run_trials, summary
    from pipeline.config import SweepConfig

    whole = run_trials(SweepConfig(trials=7, storage=f"sqlite:///{tmp_path}/a.db", study="w"), list(range(4)), score_alpha, progress=False)
    calls = []

    def interrupted(params, chunk):
        calls.append(params)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return score_alpha(params, chunk)

    resumed_config = SweepConfig(trials=7, storage=f"sqlite:///{tmp_path}/b.db", study="w")
    with pytest.raises(KeyboardInterrupt):
        run_trials(resumed_config, list(range(4)), interrupted, progress=False)
    resumed = run_trials(resumed_config, list(range(4)), score_alpha, progress=False)
    finished = lambda study: [(t.params, t.value) for t in study.trials if t.value is not None]  # noqa: E731
    assert finished(resumed) == finished(whole)
    assert summary(resumed)["best_params"] == summary(whole)["best_params"]


def test_a_killed_sweep_leaves_no_mlflow_run_running(tmp_path):
    from mlflow.tracking import MlflowClient

    from experiments.runs.tracking import HOST_TAG, PID_TAG, tracked_run
    from pipeline.config import TrackingConfig
    from pipeline.traces import connect, experiment_id

    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path}/m.db", artifacts=str(tmp_path / "artifacts"))
    mlflow = connect(tracking)
    client = MlflowClient(tracking_uri=tracking.uri)
    orphan = client.create_run(experiment_id(mlflow, tracking), tags={HOST_TAG: __import__("socket").gethostname(), PID_TAG: str(dead_pid())})
    with tracked_run(tracking, {}, "next", {}):
        pass
    assert client.get_run(orphan.info.run_id).info.status == "KILLED"


def test_a_storage_that_is_not_a_url_is_one_line(files, capsys):
    code, _, err = run(capsys, "sweep", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--embedder", "test-hash",
                       "--storage", "notaurl://x", "--no-track", "--cache-dir", files / "cache", "--out", files / "sweep")
    assert code == 2 and one_line(err).startswith("--storage notaurl://x: Optuna cannot open it (")


def test_sweep_ranges_outside_the_retriever_are_refused_with_the_config():
    from pipeline.config import SweepConfig

    with pytest.raises(HyperProveError, match=r"^sweep config: alpha=\[0.0, 2.0\] reaches 2.0, outside the retriever's range for alpha$"):
        SweepConfig(alpha=[0, 2])
    with pytest.raises(HyperProveError, match=r"^sweep config: top_k=\[0, 4\] reaches 0, outside the retriever's range for top_k$"):
        SweepConfig(top_k=[0, 4])


# --- ui ------------------------------------------------------------------------------------------------------
def test_ui_refuses_a_non_loopback_host_without_allow_remote(capsys, tmp_path):
    code, _, err = run(capsys, "ui", "--host", "0.0.0.0", "--tracking-uri", f"sqlite:///{tmp_path}/m.db")
    assert code == 2
    assert one_line(err) == ("--host 0.0.0.0: would serve the tracking store, unauthenticated, beyond this machine; "
                             "add --allow-remote if that is what you want")
    from experiments.runs.tracking import ui_command
    from pipeline.config import TrackingConfig

    command, _ = ui_command(TrackingConfig(uri=f"sqlite:///{tmp_path}/m.db"), "0.0.0.0", 5000, allow_remote=True)
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert ui_command(TrackingConfig(uri=f"sqlite:///{tmp_path}/m.db"), "::1", 5000)[0]  # loopback needs no flag


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (Linux /proc)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return children + [d for child in children for d in descendants(child)]


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_ui_stops_its_whole_server_and_takes_no_artifact_uploads(tmp_path, stop):
    """A closed terminal (SIGHUP) or SIGTERM used to leave `mlflow server` and its uvicorn
    answering; and the server took unauthenticated uploads into ./mlartifacts."""
    import signal
    import time
    import urllib.error
    import urllib.request

    from pipeline.files import process_alive

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ui = subprocess.Popen([str(Path(sys.executable).with_name("hyperprove")), "ui", "--port", str(port), "--tracking-uri",
                           f"sqlite:///{tmp_path}/m.db"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        else:
            pytest.fail("the MLflow UI did not start within 120 s")
        upload = urllib.request.Request(f"{url}/api/2.0/mlflow-artifacts/artifacts/planted.txt", data=b"x", method="PUT")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(upload, timeout=10)
        assert refused.value.code == 503 and not (tmp_path / "mlartifacts").exists()
        server = descendants(ui.pid)
        assert len(server) >= 2  # mlflow server and its uvicorn
        ui.send_signal(getattr(signal, stop))
        output = ui.communicate(timeout=60)[0].decode()
        assert ui.returncode == 0 and f"MLflow UI stopped ({stop}), with every process it started" in output
        assert not any(process_alive(pid) for pid in server)
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{url}/health", timeout=2)
    finally:
        if ui.poll() is None:
            ui.kill()


# --- late failures --------------------------------------------------------------------------------------------
class Untouchable(HashEmbedder):
    def encode(self, texts, progress=None):
        raise AssertionError("work started before the request was checked")

    encode_query = encode


def test_evaluate_checks_its_out_and_program_before_any_work(files, capsys):
    untouched = lambda config: Runtime(config, embedder=Untouchable())  # noqa: E731
    common = ["evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--retriever", "ppr",
              "--embedder", "test-hash", "--no-track", "--cache-dir", files / "cache"]
    (files / "taken").write_text("x")
    code, _, err = run(capsys, *common, "--out", files / "taken", runtime=untouched)
    assert code == 2 and one_line(err) == f"--out {files / 'taken'}: is a file, not a folder for evaluation results"
    code, _, err = run(capsys, *common, "--decomposition", "lm", "--program", files / "nowhere.json", "--out", files / "r", runtime=untouched)
    assert code == 2 and one_line(err) == f"--program {files / 'nowhere.json'}: no such file"
    assert not (files / "cache").exists()


def test_a_reused_out_keeps_nothing_of_the_earlier_run(files, capsys):
    common = ["evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--embedder", "test-hash",
              "--no-track", "--cache-dir", files / "cache", "--out", files / "results"]
    assert run(capsys, *common, "--retriever", "ppr")[0] == 0
    assert (files / "results" / "index_manifest.json").exists()
    assert run(capsys, *common, "--retriever", "dense")[0] == 0  # passage-level: no index
    assert sorted(p.name for p in (files / "results").iterdir()) == ["predictions.json", "results.json", "results.md"]


# --- quadratic sentence splitting ----------------------------------------------------------------------------------
def test_a_long_run_of_abbreviations_is_one_sentence():
    from modules.lm.checks import split_sentences

    assert split_sentences("Dr. Smith " * 20_000) == [("Dr. Smith " * 20_000).strip()]  # 200 KB: linear, well under a second
    assert split_sentences("Dr. Smith met St. John. Then they left.") == ["Dr. Smith met St. John.", "Then they left."]


# --- tracebacks that are now one line -------------------------------------------------------------------------------
def test_a_folder_indexed_into_itself_never_reads_its_index_back(files, capsys):
    """A folder is a corpus: its corpus file read, the questions file (no "title") skipped with one
    line, and the index written inside it left alone when the folder is read again."""
    code, out, _ = run(capsys, "index", files, "--out", files / "idx", "--embedder", "test-hash")
    assert code == 0 and f"{files / 'questions.json'}: skipped: not a readable JSON file (item 0: field \"title\" is missing)" in out
    assert f"{files}: 1 files, {len(CORPUS)} passages; 1 left out" in out
    code, out, _ = run(capsys, "index", "--add", files, "--into", files / "idx", "--embedder", "test-hash")
    assert code == 0 and "0 new or changed, 1 unchanged" in out and "nothing to add" in out
    assert f"{files / 'idx'}/: left out: a HyperProve index" in out


@pytest.fixture
def saved(files, capsys):
    assert run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    return files / "idx"


def rewrite_manifest(index: Path, change, sign: bool = True) -> None:
    """Edit the manifest; `sign`: and recompute its own checksum, as a deliberate edit would."""
    from pipeline.index.store import manifest_checksum

    manifest = json.loads((index / "manifest.json").read_text())
    change(manifest)
    if sign:
        manifest["manifest_sha256"] = manifest_checksum(manifest)
    (index / "manifest.json").write_text(json.dumps(manifest))


def test_a_manifest_entry_without_its_keys_is_one_line(saved):
    from pipeline.index.store import load_index

    rewrite_manifest(saved, lambda manifest: manifest["files"]["facts.jsonl"].pop("sha256"))
    with pytest.raises(HyperProveError, match=r"manifest.json: the entry of 'facts.jsonl' needs its sha256 and bytes; the index is damaged"):
        load_index(saved)
    rewrite_manifest(saved, lambda manifest: manifest.pop("embedder"))
    with pytest.raises(HyperProveError, match=r"manifest.json: 'embedder' is missing or not a dict; the index is damaged"):
        load_index(saved)


def test_a_truncated_array_with_a_matching_checksum_is_one_line(saved):
    from pipeline.files import sha256_file
    from pipeline.index.store import load_index

    path = saved / "fact_vectors.npy"
    path.write_bytes(path.read_bytes()[:200])

    def resum(manifest):
        manifest["files"]["fact_vectors.npy"] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}

    rewrite_manifest(saved, resum)
    with pytest.raises(HyperProveError, match=r"idx: cannot be read \(ValueError: .*\); the index is damaged, rebuild it$"):
        load_index(saved)


def test_a_results_file_without_config_or_systems_is_one_line_in_the_report(tmp_path, capsys):
    from experiments.runs.report import main as report

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps({"name": "run"}))
    assert report(["--results", str(tmp_path), "--out", str(tmp_path / "REPORT.md")]) == 2
    assert one_line(capsys.readouterr().err) == f"{tmp_path / 'run' / 'results.json'}: no 'systems' (dict); not written by `hyperprove evaluate`"


def test_a_program_file_that_is_a_list_is_one_line(saved, files, capsys):
    (files / "list.json").write_text("[1, 2]")
    code, _, err = run(capsys, "ask", saved, "Who directed Jaws?", "--embedder", "test-hash", "--program", files / "list.json", "--no-track")
    assert code == 2
    assert one_line(err) == f"--program {files / 'list.json'}: holds a JSON list, not a compiled HyperProve program (an object)"


@pytest.mark.parametrize("section, values, message", [
    ("retriever", {"alpha": "0.5"}, "retriever config: alpha='0.5' must be a number"),
    ("retriever", {"top_k": True}, "retriever config: top_k=True must be a whole number"),
    ("retriever", {"depth": 2.5}, "retriever config: depth=2.5 must be a whole number"),
    ("evaluation", {"limit": True}, "evaluation config: limit=True must be a whole number or null"),
    ("sweep", {"alpha": ["0", 1]}, "sweep config: alpha=['0', 1] must be a list of a number"),
    ("tracking", {"enabled": "no"}, "tracking config: enabled='no' must be true or false"),
])
def test_config_values_of_the_wrong_type_are_named(tmp_path, section, values, message):
    from pipeline.config import HyperProveConfig

    (tmp_path / "c.json").write_text(json.dumps({section: values}))
    with pytest.raises(HyperProveError) as error:
        HyperProveConfig.from_file(tmp_path / "c.json")
    assert str(error.value) == f"{tmp_path / 'c.json'}: {message}"


# --- accepted silently before ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("questions, message", [
    ([{**QUESTIONS[0], "question": "  "}], 'item 0: field "question" is empty'),
    ([QUESTIONS[0], QUESTIONS[0]], "items 0 and 1 have the same id 'q1'; ids name questions in results"),
    ([{**QUESTIONS[0], "decomposition": [{"question": "Who directed Jaws?", "answer": "x"}, {"question": "Who was the mother of #3?", "answer": "y"}]}],
     "item 0 decomposition[1]: \"#3\" refers to no earlier step ('Who was the mother of #3?')"),
])
def test_questions_that_cannot_be_scored_right_are_refused(files, questions, message):
    from experiments.data import load_questions
    from pipeline.index.corpus import load_corpus

    (files / "q.json").write_text(json.dumps(questions))
    with pytest.raises(HyperProveError) as error:
        load_questions(files / "q.json", load_corpus(files / "corpus.json"))
    assert str(error.value) == f"{files / 'q.json'}: {message}"


def test_the_same_passage_twice_is_refused(files):
    from pipeline.index.corpus import load_corpus

    (files / "twice.json").write_text(json.dumps([CORPUS[0], CORPUS[1], CORPUS[0]]))
    with pytest.raises(HyperProveError) as error:
        load_corpus(files / "twice.json")
    assert str(error.value) == f"{files / 'twice.json'}: items 0 and 2 are the same passage (title and text); keep one"


# --- scratch left by a kill --------------------------------------------------------------------------------------------
def test_scratch_of_a_killed_writer_is_removed_by_the_next_write(saved, files, capsys):
    pid = dead_pid()
    (files / f".idx.tmp-{pid}").mkdir()
    (files / f".idx.tmp-{pid}" / "facts.jsonl").write_text("half")
    (files / f".results.json.tmp-{pid}").write_text("half")
    assert run(capsys, "index", files / "corpus.json", "--out", saved, "--embedder", "test-hash")[0] == 0
    assert not (files / f".idx.tmp-{pid}").exists()
    from pipeline.files import atomic_write_json

    atomic_write_json(files / "results.json", {})
    assert not (files / f".results.json.tmp-{pid}").exists()


def test_an_index_caught_between_its_two_renames_is_put_back(saved, files):
    from pipeline.index.store import load_index

    before = snapshot(saved)
    os.replace(saved, files / f".idx.old-{dead_pid()}")  # killed after moving the old index aside
    index = load_index(saved)
    assert snapshot(saved) == before and index.counts()["passages"] == len(CORPUS)


def test_vectors_of_the_wrong_shape_are_still_caught(saved):
    from pipeline.files import atomic_save_npy, sha256_file
    from pipeline.index.store import load_index

    path = saved / "passage_vectors.npy"
    atomic_save_npy(path, np.zeros((2, 256), dtype=np.float32))
    rewrite_manifest(saved, lambda m: m["files"].update({"passage_vectors.npy": {"sha256": sha256_file(path), "bytes": path.stat().st_size}}))
    with pytest.raises(HyperProveError, match="passage vectors do not match the manifest counts"):
        load_index(saved)


# --- shared files that are data, not instructions ---------------------------------------------------------------------
def compiled_file(files, change) -> Path:
    from pipeline.program import HyperProve

    HyperProve(None).save(str(files / "shared.json"))
    state = json.loads((files / "shared.json").read_text())
    change(state)
    (files / "shared.json").write_text(json.dumps(state))
    return files / "shared.json"


@pytest.mark.parametrize("change, named", [
    (lambda s: s["answer_hop.answer"].update(config={"api_base": "http://other-host/v1"}), "answer_hop.answer.config: not part of a predictor's state"),
    (lambda s: s["generate.generate"].update(lm={"model": "openai/gpt-4o", "mock_response": "Paris"}),
     "generate.generate.lm: names an LM; the LM is chosen by --lm and the config, never by a program file"),
    (lambda s: s.update({"spy.predict": s["generate.generate"]}), None),
    (lambda s: s["decompose.decompose"]["signature"].update(model="x"), "decompose.decompose.signature: must hold the instructions"),
    (lambda s: s["rewrite.rewrite"].update(traces=[{"lm": "x"}]), "rewrite.rewrite.traces: holds entries, where DSPy writes an empty list"),
])
def test_a_program_file_holding_more_than_demos_and_signatures_is_refused(saved, files, capsys, change, named):
    path = compiled_file(files, change)
    code, _, err = run(capsys, "ask", saved, "Who directed Jaws?", "--embedder", "test-hash", "--program", path, "--no-track")
    assert code == 2
    line = one_line(err)
    if named is None:
        assert line.startswith(f"--program {path}: 'spy.predict': not a predictor of HyperProve (") and line.endswith("; refused")
    else:
        assert line.startswith(f"--program {path}: {named}"), line


def test_a_compiled_program_file_loads_its_demos_and_instructions_and_nothing_else(files):
    from pipeline.program import HyperProve, load_compiled

    def change(state):
        state["decompose.decompose"]["demos"] = [{"question": "Q?", "sub_questions": ["A?", "B #1?"]}]
        state["decompose.decompose"]["signature"]["instructions"] = "Split it."

    program = load_compiled(HyperProve(None), str(compiled_file(files, change)))
    predictor = program.decompose.decompose
    assert [dict(demo) for demo in predictor.demos] == [{"question": "Q?", "sub_questions": ["A?", "B #1?"]}]
    assert predictor.signature.instructions == "Split it." and predictor.lm is None


def crafted_pickle(code: str) -> bytes:
    """Pickle protocol 4 that a module-prefix allow-list lets through: a dotted name under
    `litellm.types.*` reaches builtins.exec, called with `code`."""
    module, name, text = b"litellm.types.vector_store_files", b"builtins.exec", code.encode()
    short = lambda data: b"\x8c" + bytes([len(data)]) + data  # noqa: E731 - SHORT_BINUNICODE
    return b"\x80\x04" + short(module) + short(name) + b"\x93" + short(text) + b"\x85R."  # STACK_GLOBAL, TUPLE1, REDUCE


def test_a_planted_lm_cache_entry_is_never_unpickled(tmp_path, monkeypatch):
    """The crafted row, in DSPy's pickle cache where the project's LM cache lived and as the
    response of a row of the JSON cache: looking the request up runs nothing and is a miss."""
    import sqlite3

    import dspy
    from diskcache.core import MODE_PICKLE

    from pipeline.lm.cache import STORE_FILE
    from pipeline.lm.session import configure_lm_cache

    monkeypatch.setattr(dspy, "cache", dspy.cache)
    marker = tmp_path / "ran"
    payload = crafted_pickle(f"open({str(marker)!r}, 'w').write('code ran')")
    request = {"model": "openai/m", "messages": [{"role": "user", "content": "q"}], "_fn_identifier": "dspy.clients.lm.litellm_completion"}
    dspy.configure_cache(enable_disk_cache=True, enable_memory_cache=False, disk_cache_dir=str(tmp_path / "cache" / "lm"), restrict_pickle=True)
    key = dspy.cache.cache_key(request)
    dspy.cache.disk_cache.set(key, "placeholder")
    for shard in (tmp_path / "cache" / "lm").rglob("cache.db"):
        with sqlite3.connect(shard) as db:
            db.execute("UPDATE Cache SET mode = ?, value = ? WHERE key = ?", (MODE_PICKLE, payload, key))
    configure_lm_cache(tmp_path / "cache")
    assert dspy.cache.get(request) is None and not marker.exists()
    with sqlite3.connect(tmp_path / "cache" / STORE_FILE) as db:
        db.execute("INSERT INTO responses VALUES (?, ?, ?, 0)", (key + "0", "{}", payload))
        db.execute("INSERT INTO responses VALUES (?, ?, ?, 0)", (key + "1", "{}", payload.decode("latin-1")))
    assert dspy.cache.store.get(key + "0") is None and dspy.cache.store.get(key + "1") is None and not marker.exists()


# --- one writer per index, ids never given twice ---------------------------------------------------------------------
def test_concurrent_writers_into_one_index_lose_nothing(files, capsys, monkeypatch):
    """Two `--add`s and a `--delete` at once (threads with their own lock descriptors, each slowed
    inside its change so that all three overlap): every batch and the deletion are in the index."""
    import threading
    import time

    from pipeline.config import HyperProveConfig
    from pipeline.index import commands as index_commands
    from pipeline.index.commands import add_to_index, delete_from_index
    from pipeline.index.store import load_index

    assert run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    grow, shrink = index_commands.grow_index, index_commands.shrink_index
    monkeypatch.setattr(index_commands, "grow_index", lambda *a, **k: (time.sleep(0.3), grow(*a, **k))[1])
    monkeypatch.setattr(index_commands, "shrink_index", lambda *a, **k: (time.sleep(0.3), shrink(*a, **k))[1])
    batches = {name: [{"title": f"{name} {k}", "text": f"{name} {k} is a place in Ohio."} for k in range(3)] for name in ("north", "south")}
    for name, batch in batches.items():
        (files / f"{name}.json").write_text(json.dumps(batch))
    (files / "gone.json").write_text(json.dumps(["Cincinnati"]))
    config = HyperProveConfig().with_overrides(index={"embedder": "test-hash"})
    runtime = Runtime(config, embedder=HashEmbedder())
    lines, errors = [], []

    def write(change):
        try:
            change()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    writers = [threading.Thread(target=write, args=(lambda n=name: add_to_index(files / f"{n}.json", files / "idx", config, runtime, lines.append),))
               for name in batches]
    writers.append(threading.Thread(target=write, args=(lambda: delete_from_index(files / "gone.json", files / "idx", config, runtime, lines.append),)))
    for writer in writers:
        writer.start()
        time.sleep(0.05)
    for writer in writers:
        writer.join()
    assert not errors
    index = load_index(files / "idx")
    titles = {p.title for p in index.passages}
    assert titles == {p["title"] for p in CORPUS if p["title"] != "Cincinnati"} | {p["title"] for b in batches.values() for p in b}
    assert index.generation == 3 and sorted(index.passage_ids.tolist()) == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]
    assert sum("is writing it; waiting for it to finish" in line for line in lines) >= 2


def test_a_second_save_over_a_changed_index_is_refused(saved):
    from pipeline.index.store import load_index, save_index

    index = load_index(saved)
    save_index(load_index(saved), saved)  # another writer, not using the lock, got there first: still generation 0
    other = load_index(saved)
    other.info["generations"] = [*other.info["generations"], {"generation": 1}]
    save_index(other, saved)
    with pytest.raises(HyperProveError, match=r"changed by another writer \(generation 1, this change was made on generation 0\); nothing written"):
        save_index(index, saved, replaces=0)
    assert load_index(saved).generation == 1


def test_a_deleted_id_is_never_given_again(files, capsys):
    top = len(CORPUS) - 1
    (files / "gone.json").write_text(json.dumps([top]))
    (files / "new.json").write_text(json.dumps([{"title": "Dayton", "text": "Dayton is a city in Ohio."}]))
    assert run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    for argv in (["--delete", files / "gone.json"], ["--add", files / "new.json"]):
        assert run(capsys, "index", *argv, "--into", files / "idx", "--embedder", "test-hash")[0] == 0
    code, out, _ = run(capsys, "index", "--delete", files / "gone.json", "--into", files / "idx", "--embedder", "test-hash")
    assert code == 0 and f"item 0 ({top}) was removed in generation 1: skipped" in out and "nothing to delete" in out
    rows = [json.loads(line) for line in (files / "idx" / "passages.jsonl").read_text().splitlines()]
    assert rows[-1] == {"id": top + 1, "title": "Dayton", "text": "Dayton is a city in Ohio."}
    assert json.loads((files / "idx" / "manifest.json").read_text())["next_passage_id"] == top + 2


# --- indexes verified, not trusted -------------------------------------------------------------------------------------
def resum(index: Path, name: str):
    """Change the manifest's entry of file `name` to its present checksum (and sign the manifest)."""
    from pipeline.files import sha256_file

    path = index / name
    rewrite_manifest(index, lambda m: m["files"].update({name: {"sha256": sha256_file(path), "bytes": path.stat().st_size}}))


def test_a_hand_edited_manifest_is_refused(saved):
    from pipeline.index.store import load_index

    rewrite_manifest(saved, lambda m: m["counts"].update(passages=4), sign=False)
    with pytest.raises(HyperProveError, match=r"manifest.json: its fields do not match its manifest_sha256 \(edited by hand\?\); the index is damaged"):
        load_index(saved)


def test_another_corpus_checksum_in_the_manifest_is_refused(saved, files):
    from pipeline.index.build import corpus_checksum
    from pipeline.index.corpus import load_corpus
    from pipeline.index.store import load_index

    (files / "more.json").write_text(json.dumps(CORPUS + [{"title": "Dayton", "text": "Dayton is a city in Ohio."}]))
    rewrite_manifest(saved, lambda m: m.update(corpus_sha256=corpus_checksum(load_corpus(files / "more.json"))))
    with pytest.raises(HyperProveError, match=r"manifest.json: its corpus_sha256 is not the checksum of the passages in passages.jsonl"):
        load_index(saved)


@pytest.mark.parametrize("name, change, message", [
    ("fact_vectors.npy", lambda v: np.full_like(v, np.nan), r"fact vector 0 is not finite and of unit norm \(squared norm nan\)"),
    ("passage_vectors.npy", lambda v: (v * 100).astype(np.int8), r"passage vectors are int8 of shape \(5, 256\), not float32 of \(5, 256\)"),
    ("entity_vectors.npy", lambda v: v * 2, r"entity vector 0 is not finite and of unit norm \(squared norm 4.0"),
])
def test_vectors_that_are_not_unit_float32_are_refused(saved, name, change, message):
    from pipeline.files import atomic_save_npy
    from pipeline.index.store import load_index

    atomic_save_npy(saved / name, change(np.load(saved / name)))
    resum(saved, name)
    with pytest.raises(HyperProveError, match=message):
        load_index(saved)


@pytest.mark.parametrize("passage, message", [(999999, "facts.jsonl names passage 999999 is out of range"), (-1, "names passage -1 is out of range")])
def test_a_fact_of_no_passage_is_refused_at_load(saved, passage, message):
    from pipeline.index.store import load_index

    lines = (saved / "facts.jsonl").read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "passage": passage})
    (saved / "facts.jsonl").write_text("\n".join(lines) + "\n")
    resum(saved, "facts.jsonl")
    with pytest.raises(HyperProveError, match=message):
        load_index(saved)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(generations={"generation": 0}), "'generations' is missing or not a list"),
    (lambda m: m["extractor"].pop("name"), "the extractor entry needs its name"),
    (lambda m: m.update(built_on=[1, 2]), "'built_on' must map each vector set to a count"),
    (lambda m: m.update(generations=[{"added": 5}]), "'generations' must list objects, each with its generation number"),
])
def test_hand_edited_manifest_fields_are_one_line_on_add(saved, files, capsys, change, message):
    (files / "new.json").write_text(json.dumps([{"title": "Dayton", "text": "Dayton is a city in Ohio."}]))
    rewrite_manifest(saved, change)
    code, _, err = run(capsys, "index", "--add", files / "new.json", "--into", saved, "--embedder", "test-hash")
    assert code == 2 and one_line(err) == f"{saved / 'manifest.json'}: {message}; the index is damaged, rebuild it"


# --- bounded work on any input ----------------------------------------------------------------------------------------
def test_naming_entities_in_a_long_capitalised_query_is_linear(saved, monkeypatch):
    """Every span of a 1,000-word capitalised run was normalised (cubic: 133 s); now at most the
    longest name's words and two more from each word."""
    from pipeline.index import build as index_module
    from pipeline.index.store import load_index

    index = load_index(saved)
    calls = []
    normalise = index_module.normalise_entity
    monkeypatch.setattr(index_module, "normalise_entity", lambda text: (calls.append(text), normalise(text))[1])
    for words in (500, 1000):
        calls.clear()
        assert index.name_entities(" ".join(["Steven Spielberg"] + [f"Name{k}" for k in range(words)])) == [index.entity_ids["steven spielberg"]]
        assert len(calls) <= (words + 2) * (index.longest_name + 2)
    assert index.longest_name == 2


def best_seconds(work, repeats: int = 5) -> float:
    """The fastest of a few runs with the garbage collector off: one slow run says nothing about the
    work timed (on a busy CI machine a 0.05 s call once took 1.1 s)."""
    import gc
    import time

    gc.collect()
    gc.disable()
    try:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            work()
            times.append(time.perf_counter() - started)
        return min(times)
    finally:
        gc.enable()


def test_a_sentence_of_many_names_and_dates_is_linear():
    """8,000 name-date pairs in one sentence took 18.8 s (each name checked against every date):
    four times the names and four times the dates must take about four times as long, not sixteen."""
    from modules.lm.checks import find_entities

    pairs = lambda n: " ".join(f"Name{k} 3 May {1000 + k // 9}," for k in range(n))  # noqa: E731
    few, many = pairs(2000), pairs(8000)
    assert len(find_entities(many, "")) == 8000 + 889  # the names and the distinct dates
    assert best_seconds(lambda: find_entities(many, "")) < 8 * best_seconds(lambda: find_entities(few, "")) + 0.05


@pytest.mark.parametrize("section, values, message", [
    ("retriever", {"walk_steps": 10_000_000}, "retriever config: walk_steps=10000000 must lie in [0, 50]"),
    ("retriever", {"depth": 10**400}, "retriever config: depth=1000000000000000000000000000000000000000... (401 characters) must lie in [0, 10]"),
    ("retriever", {"subgraph_bound": 10**9}, "retriever config: subgraph_bound=1000000000 must lie in [1, 100000]"),
    ("lm", {"max_tokens": 10**6}, "lm config: max_tokens=1000000 must lie in [16, 32768]"),
    ("program", {"max_hops": 1000}, "program config: max_hops=1000 must lie in [1, 10]"),
])
def test_size_settings_are_bounded(tmp_path, section, values, message):
    from pipeline.config import HyperProveConfig

    (tmp_path / "c.json").write_text(json.dumps({section: values}))
    with pytest.raises(HyperProveError) as error:
        HyperProveConfig.from_file(tmp_path / "c.json")
    assert str(error.value) == f"{tmp_path / 'c.json'}: {message}"


# --- tracebacks that became one line -----------------------------------------------------------------------------------
HOTPOT = {"_id": "h1", "question": "Which city is Jaws set near?", "answer": "Amity", "type": "bridge",
          "context": [["Jaws (film)", ["Jaws is a 1975 thriller film directed by Steven Spielberg."]]],
          "supporting_facts": [["Jaws (film)", 0]]}
MUSIQUE = {"id": "m1", "question": "Who directed Jaws?", "answer": "Steven Spielberg",
           "paragraphs": [{"title": "Jaws (film)", "paragraph_text": CORPUS[0]["text"], "is_supporting": True}],
           "question_decomposition": [{"question": "Who directed Jaws?", "answer": "Steven Spielberg"}]}


@pytest.mark.parametrize("item, message", [
    ({**MUSIQUE, "paragraphs": [{**MUSIQUE["paragraphs"][0], "title": 7}]}, 'item 0 paragraphs[0]: field "title" must be str, found int'),
    ({**MUSIQUE, "paragraphs": [{**MUSIQUE["paragraphs"][0], "paragraph_text": 7}]}, 'item 0 paragraphs[0]: field "paragraph_text" must be str, found int'),
    ({**MUSIQUE, "question_decomposition": [{"question": 5, "answer": "x"}]}, 'item 0 question_decomposition[0]: field "question" must be str, found int'),
    ({**HOTPOT, "supporting_facts": [1, 2]}, "item 0: supporting_facts[0] must be [title, sentence id], found 1"),
    ({**HOTPOT, "context": [["Jaws (film)", [1, 2]]]}, "item 0: context[0] must be [title, [sentence, ...]] (texts)"),
])
def test_hipporag_question_files_of_the_wrong_types_are_one_line(files, item, message):
    from experiments.data import load_questions
    from pipeline.index.corpus import load_corpus

    (files / "q.json").write_text(json.dumps([item]))
    with pytest.raises(HyperProveError) as error:
        load_questions(files / "q.json", load_corpus(files / "corpus.json"))
    assert str(error.value) == f"{files / 'q.json'}: {message}"


def test_json_nested_too_deeply_is_one_line(files, capsys):
    (files / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = run(capsys, "index", files / "deep.json", "--out", files / "idx", "--embedder", "test-hash")
    assert code == 2 and one_line(err) == f"{files / 'deep.json'}: JSON nested too deeply to be a corpus file"


# --- a shared config decides how the program answers, never where requests go or what is written ---------------
@pytest.mark.parametrize("values, field, reason", [
    ({"lm": {"model": "openai/gpt-4o-mini", "api_base": "http://host.example/v1"}}, "lm.api_base", "names a host"),
    ({"tracking": {"uri": "http://traces.example:5000"}}, "tracking.uri", "names a host"),
    ({"sweep": {"storage": "postgresql://db.example/studies"}}, "sweep.storage", "names a host"),
    ({"sweep": {"storage": "sqlite:////home/someone/studies.db"}}, "sweep.storage", "is a file outside the working folder"),
    ({"sweep": {"best_out": "~/.bashrc"}}, "sweep.best_out", "is outside the working folder"),
    ({"evaluation": {"out": "../../elsewhere"}}, "evaluation.out", "is outside the working folder"),
    ({"cache_dir": "/tmp/planted-cache"}, "cache_dir", "is outside the working folder"),
    ({"index": {"embedder": "/etc"}}, "index.embedder", "names a folder on disk"),
])
def test_a_shared_config_cannot_choose_where_requests_go_or_what_is_written(tmp_path, capsys, values, field, reason):
    from pipeline.config import HyperProveConfig

    path = tmp_path / "shared.json"
    path.write_text(json.dumps(values))
    with pytest.raises(HyperProveError, match=f"^{path}: {field} = .* {reason}: it decides .*, which a shared config may not; "
                                              ".*--trust-config if this file is your own$"):
        HyperProveConfig.from_file(path)
    assert HyperProveConfig.from_file(path, trusted=True)  # the user's own file: taken as it is
    # through the command line: one line, before any work, and --trust-config honours the file
    code, _, err = run(capsys, "ask", tmp_path / "no-index", "Who directed Jaws?", "--config", path)
    assert code == 2 and one_line(err).startswith(f"{path}: {field} = ")
    code, _, err = run(capsys, "ask", tmp_path / "no-index", "Who directed Jaws?", "--config", path, "--trust-config")
    assert code == 2 and "shared config" not in err and "no-index" in err


def test_the_committed_experiment_configs_are_safe_to_share():
    from pipeline.config import HyperProveConfig

    configs = sorted(Path("experiments/configs").rglob("*.json"))
    assert len(configs) > 50
    for path in configs:
        HyperProveConfig.from_file(path)  # none sets a host, an outside path or a model folder


def test_every_lm_run_says_which_model_it_talks_to_and_where():
    from pipeline.config import HyperProveConfig
    from pipeline.lm.session import LMSession, lm_whereabouts

    def said(**lm) -> str:
        return lm_whereabouts(HyperProveConfig().with_overrides(lm=lm))

    assert said(model="openai/gpt-4o-mini", api_base="http://10.0.0.5:8000/v1", timeout=30, retries=2) == (
        "LM: openai/gpt-4o-mini at http://10.0.0.5:8000/v1; a request gets 30 s and 2 retries")
    assert said(model="openai/gpt-4o-mini") == "LM: openai/gpt-4o-mini at openai's own endpoint; a request gets 300 s and 8 retries"
    assert said().endswith(" in this process (the embedded model); a request gets 300 s and 2 retries")
    # a session that makes its LM says it once
    lines = []
    LMSession(HyperProveConfig().with_overrides(lm={"model": "openai/gpt-4o-mini", "api_base": "http://10.0.0.5:8000/v1"}), log=lines.append)
    assert lines == ["LM: openai/gpt-4o-mini at http://10.0.0.5:8000/v1; a request gets 300 s and 8 retries"]


def test_a_dead_or_hung_lm_is_given_up_within_the_time_its_settings_state():
    from pipeline.config import LMConfig

    # (retries + 1) tries of `timeout` seconds, with LiteLLM's backoff (1, 2, 4 ... s, at most 60) between them
    assert LMConfig(timeout=2, retries=0).give_up_seconds == 2
    assert LMConfig(timeout=2, retries=2).give_up_seconds == 2 * 3 + 1 + 2
    assert LMConfig(model="openai/x").give_up_seconds == 300 * 9 + (1 + 2 + 4 + 8 + 16 + 32 + 60 + 60)


# --- serve answers only its own page ----------------------------------------------------------------------------
@pytest.fixture
def served_index(files, capsys):
    code, _, _ = run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")
    assert code == 0
    return files / "idx"


def own_page_client(served_index, lm=None, hosts=()):
    from dspy.utils import DummyLM
    from fastapi.testclient import TestClient

    from pipeline.config import HyperProveConfig
    from pipeline.serve.ask import Asker
    from pipeline.serve.server import make_app

    config = HyperProveConfig().with_overrides(index={"embedder": "test-hash"}, tracking={"enabled": False, "traces": False})
    asker = Asker(config, served_index, Runtime(config, lm=lm or DummyLM(two_hop_script(final_answer="2017")), embedder=HashEmbedder()))
    return TestClient(make_app(asker, places=1, hosts=hosts), base_url="http://127.0.0.1:8000")


@pytest.mark.parametrize("headers, message", [
    ({"Host": "rebound.example.com:8000"}, "Host 'rebound.example.com:8000' is not a name of this server"),
    ({"Origin": "http://evil.example"}, "a request from the page of 'http://evil.example', not this server's own"),
    ({"Origin": "http://localhost:8000"}, "a request from the page of 'http://localhost:8000', not this server's own"),
    ({"Sec-Fetch-Site": "cross-site"}, "a request from another site's page"),
])
def test_serve_refuses_requests_from_other_sites_and_other_host_names(served_index, headers, message):
    client = own_page_client(served_index)
    for method, path in (("post", "/ask"), ("get", "/ask/stream?question=x"), ("get", "/health"), ("get", "/")):
        response = getattr(client, method)(path, headers=headers, **({"json": {"question": "Who?"}} if method == "post" else {}))
        assert (response.status_code, response.json()) == (403, {"error": message}), path
    # its own page and programs on this machine are answered
    assert client.get("/health", headers={"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"}).status_code == 200
    assert client.get("/health", headers={"Host": "localhost:8000"}).status_code == 200
    # bound to a named interface, that name is the server's too
    assert own_page_client(served_index, hosts=("box.lan",)).get("/health", headers={"Host": "box.lan:8000"}).status_code == 200


def test_serve_takes_only_json_posts_of_a_small_body_and_says_why_in_one_line(served_index):
    client = own_page_client(served_index)
    plain = client.post("/ask", content=b'{"question": "Who directed Jaws?"}', headers={"Content-Type": "text/plain"})
    assert (plain.status_code, plain.json()) == (415, {"error": "the body must be application/json, not text/plain"})
    form = client.post("/ask", data={"question": "Who directed Jaws?"})
    assert form.status_code == 415
    deep = client.post("/ask", content=b"[" * 8000 + b"]" * 8000, headers={"Content-Type": "application/json"})
    assert (deep.status_code, deep.json()) == (400, {"error": "the body's JSON is nested too deeply"})
    surrogate = client.post("/ask", content=b'{"question": "Who \\ud800 directed Jaws?"}', headers={"Content-Type": "application/json"})
    assert surrogate.status_code == 422 and "which is not text" in surrogate.json()["error"]
    latin = client.post("/ask", content=b'{"question": "Caf\xe9?"}', headers={"Content-Type": "application/json"})
    assert (latin.status_code, latin.json()) == (400, {"error": "the body is not UTF-8 text"})
    assert client.get("/ask/stream?question=Who%ED%A0%80%FF").status_code in (200, 422)  # undecodable bytes: never a 500
    assert client.get("/docs").status_code == 404 and client.get("/openapi.json").status_code == 404


def test_a_body_over_the_cap_is_refused_before_it_is_read(served_index):
    """A 300 MB body is refused by its Content-Length before one byte is read, and a body that
    does not say its length as soon as it passes the cap."""
    import asyncio

    from pipeline.serve.server import MAX_BODY

    app = own_page_client(served_index).app

    def call(headers, chunks):
        reads, sent = [], []

        async def receive():
            reads.append(1)
            if chunks:
                return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": "/ask", "raw_path": b"/ask", "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
                 "client": ("127.0.0.1", 5000), "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), *headers]}
        asyncio.run(app(scope, receive, send))
        return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:])), len(reads)

    assert call([(b"content-length", b"300000000")], [b"x" * 1024] * 10) == (413, {"error": f"the body is 300000000 bytes; at most {MAX_BODY}"}, 0)
    status, body, reads = call([], [b"x" * 4096] * 1000)  # chunked: no length given
    assert (status, body) == (413, {"error": f"the body is over {MAX_BODY} bytes"}) and reads == MAX_BODY // 4096 + 1


def test_a_question_whose_client_left_while_it_waited_is_dropped_not_answered():
    import asyncio
    import threading

    from pipeline.serve.server import Gone, Turns

    answered, hold = [], threading.Event()

    async def scene() -> Turns:
        turns = Turns(places=1)
        holding = await turns.run(lambda: hold.wait(10) and answered.append("first") or {})  # takes the one place
        left = asyncio.Event()
        waiting = asyncio.ensure_future(turns.run(lambda: answered.append("dropped") or {}, gone=left.wait))
        await asyncio.sleep(0.05)
        assert turns.waiting == 1
        left.set()  # its client disconnects while it waits
        with pytest.raises(Gone):
            await waiting
        hold.set()
        await holding
        return turns

    turns = asyncio.run(scene())
    assert answered == ["first"] and turns.dropped == 1 and turns.waiting == 0 and turns.answering == 0


def test_a_hung_lm_is_a_503_within_the_stated_time(served_index):
    """An LM that accepts the connection and never replies: with a 1 s timeout and one retry the
    question is a 503 in about 1 + 1 + 1 s (backoff), not an hour."""
    import time

    from fastapi.testclient import TestClient

    from pipeline.config import HyperProveConfig
    from pipeline.serve.ask import Asker
    from pipeline.serve.server import make_app

    hanging = HangingLM()
    try:
        config = HyperProveConfig().with_overrides(index={"embedder": "test-hash"}, tracking={"enabled": False, "traces": False},
                                                   lm={"api_base": hanging.address, "timeout": 1, "retries": 1})
        asker = Asker(config, served_index, Runtime(config, embedder=HashEmbedder()))
        client = TestClient(make_app(asker, places=1), base_url="http://127.0.0.1:8000")
        started = time.perf_counter()
        response = client.post("/ask", json={"question": "Who directed Jaws?"})
        seconds = time.perf_counter() - started
    finally:
        hanging.close()
    assert response.status_code == 503 and "error" in response.json(), response.text
    assert seconds < config.lm.give_up_seconds + 10, seconds


def test_sigterm_ends_serve_within_seconds_while_a_question_hangs(served_index, tmp_path):
    import signal
    import time
    import urllib.request

    port, hanging = free_port(), HangingLM()
    script = (f"from pipeline.cli import main; from pipeline.runtime import Runtime; from tests.support import HashEmbedder; "
              f"raise SystemExit(main(['serve', {str(served_index)!r}, '--port', '{port}', '--embedder', 'test-hash', '--no-track', "
              f"'--api-base', {hanging.address!r}, '--lm-timeout', '600'], make_runtime=lambda c: Runtime(c, embedder=HashEmbedder())))")
    process = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.3)
        asking = threading_post(f"http://127.0.0.1:{port}/ask", {"question": "Who directed Jaws?"})
        time.sleep(1.5)  # the question is now waiting on the LM
        started = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        seconds = time.perf_counter() - started
    finally:
        process.kill()
        hanging.close()
    out = process.stdout.read()
    assert process.returncode == 0 and "serve stopped (SIGTERM)" in out, out
    assert seconds < 10, seconds
    asking.join(5)


def threading_post(url: str, body: dict):
    import threading
    import urllib.request

    def post():
        try:
            urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=30)
        except OSError:
            pass

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


class Upstream:
    """A stand-in for llama.cpp's server: answers every path (`/props` names a file under $HOME)
    and reflects any Origin in its CORS headers, as llama.cpp does."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.reply({"path": self.path, "model_path": "/home/someone/.cache/model.gguf"})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                self.reply({"path": self.path, "body": json.loads(body), "origin": self.headers.get("origin")})

            def reply(self, data):
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Access-Control-Allow-Origin", self.headers.get("origin") or "*")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_serve_lm_passes_only_the_api_to_programs_and_nothing_to_web_pages():
    from starlette.testclient import TestClient

    from pipeline.lm.local import guard

    upstream = Upstream()
    try:
        with TestClient(guard(upstream.address, ()), base_url="http://127.0.0.1:8080") as client:
            completion = client.post("/v1/chat/completions", json={"messages": []})
            assert completion.status_code == 200 and completion.json()["body"] == {"messages": []}
            assert not [name for name in completion.headers if name.startswith("access-control-")]
            assert client.get("/health").status_code == 200 and client.get("/v1/models").status_code == 200
            props = client.get("/props")
            assert props.status_code == 404 and "model_path" not in props.text
            for headers in ({"Origin": "http://evil.example"}, {"Origin": "http://127.0.0.1:8080"}, {"Sec-Fetch-Site": "cross-site"},
                            {"Host": "rebound.example.com:8080"}):
                refused = client.post("/v1/chat/completions", json={"messages": []}, headers=headers)
                assert refused.status_code == 403 and "model_path" not in refused.text, headers
            options = client.options("/v1/chat/completions", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
            assert options.status_code == 403 and "access-control-allow-origin" not in options.headers
    finally:
        upstream.server.shutdown()


def test_serve_lm_binds_its_guard_and_llama_cpp_listens_on_loopback_only(monkeypatch):
    import threading
    import urllib.error
    import urllib.request

    import pipeline.lm.local as local_model
    from pipeline.config import LMConfig

    upstream = Upstream()

    class FakeServer:
        def __init__(self, *args, **kwargs):
            assert "adjust" not in kwargs  # llama.cpp keeps its own loopback port; nothing rebinds it
            self.address = upstream.address

    monkeypatch.setattr(local_model, "LocalServer", FakeServer)
    monkeypatch.setattr(local_model, "local_model_path", lambda folder: Path("model.gguf"))
    port, stop, lines, seen = free_port(), threading.Event(), [], {}

    def client():  # while serve-lm runs in the main thread (it waits for the stop signals there)
        try:
            for _ in range(100):
                if lines:
                    break
                threading.Event().wait(0.1)
            asked = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", b'{"messages": []}', {"Content-Type": "application/json"})
            seen["completion"] = json.loads(urllib.request.urlopen(asked, timeout=10).read())["path"]
            for name, request in (("props", urllib.request.Request(f"http://127.0.0.1:{port}/props")),
                                  ("page", urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Origin": "http://evil.example"}))):
                try:
                    urllib.request.urlopen(request, timeout=10)
                except urllib.error.HTTPError as refused:
                    seen[name] = refused.code
        finally:
            stop.set()

    asking = threading.Thread(target=client)
    asking.start()
    try:
        local_model.serve_local_model(LMConfig(), "127.0.0.1", port, log=lines.append, stop=stop)
    finally:
        asking.join(20)
        upstream.server.shutdown()
    assert seen == {"completion": "/v1/chat/completions", "props": 404, "page": 403}
    assert "programs only, no web page's requests" in lines[0] and lines[-1] == "serve-lm stopped (stop)"


# --- a folder stays a folder ------------------------------------------------------------------------------------
@pytest.fixture
def folder(tmp_path):
    outside = tmp_path / "home"
    (outside / ".aws").mkdir(parents=True)
    (outside / ".aws" / "credentials").write_text("aws_secret_access_key = SECRET-KEY-123")
    (outside / "private").mkdir()
    (outside / "private" / "diary.txt").write_text("My private diary says the vault code is 4711.")
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("Ada Lovelace was a mathematician.")
    (docs / "notes.txt").symlink_to(outside / ".aws" / "credentials")
    (docs / "private").symlink_to(outside / "private", target_is_directory=True)
    (docs / "sub" / "loop").symlink_to(docs, target_is_directory=True)
    return docs


def test_a_folder_is_read_only_through_its_own_files_and_each_link_is_named(folder):
    from pipeline.index.documents import Reading, read_folder

    lines = []
    read = read_folder(folder, log=lines.append)
    assert sorted(read.files) == ["a.txt"] and not any("SECRET" in p.text or "4711" in p.text for p in read.passages)
    linked = [line for line in lines if ": skipped: a link (to " in line]
    assert sorted(line.split(": skipped:")[0] for line in linked) == [str(folder / "notes.txt"), str(folder / "private"), str(folder / "sub" / "loop")]
    assert all(line.endswith("(index --follow-links reads what its links point to)") for line in linked)

    # asked for, links are followed, files and folders alike, and a loop is named and skipped
    lines = []
    read = read_folder(folder, Reading(follow_links=True), log=lines.append)
    assert sorted(read.files) == ["a.txt", "notes.txt", "private/diary.txt"]
    assert f"{folder / 'sub' / 'loop'}/: skipped: a link back to {folder.resolve()}, a folder being read (a loop)" in lines


def test_an_index_of_a_folder_with_links_holds_none_of_their_text_unless_asked(folder, capsys):
    code, out, _ = run(capsys, "index", folder, "--out", folder.parent / "idx", "--embedder", "test-hash")
    assert code == 0 and "SECRET-KEY-123" not in (folder.parent / "idx" / "passages.jsonl").read_text()
    assert f"{folder / 'notes.txt'}: skipped: a link (to {folder.parent / 'home' / '.aws' / 'credentials'})" in out
    code, out, _ = run(capsys, "index", folder, "--out", folder.parent / "idx2", "--embedder", "test-hash", "--follow-links")
    assert code == 0 and "SECRET-KEY-123" in (folder.parent / "idx2" / "passages.jsonl").read_text()


def test_a_decoy_manifest_does_not_hide_a_folder_and_a_real_index_is_named(tmp_path, capsys):
    from pipeline.index.documents import read_folder

    docs = tmp_path / "docs"
    (docs / "decoy").mkdir(parents=True)
    (docs / "decoy" / "manifest.json").write_text(json.dumps({"format": "hyperprove-index"}))
    (docs / "decoy" / "kept.txt").write_text("Charles Babbage was born in London.")
    (docs / "a.txt").write_text("Ada Lovelace was a mathematician.")
    (tmp_path / "c.json").write_text(json.dumps(CORPUS))
    assert run(capsys, "index", tmp_path / "c.json", "--out", docs / "idx", "--embedder", "test-hash")[0] == 0
    lines = []
    read = read_folder(docs, log=lines.append)
    assert sorted(read.files) == ["a.txt", "decoy/kept.txt"]
    assert f"{docs / 'idx'}/: left out: a HyperProve index" in lines


@pytest.mark.parametrize("name, data, text", [
    ("bom16.txt", "Ada Lovelace wrote the first program.".encode("utf-16"), "Ada Lovelace wrote the first program."),
    ("le16.txt", "Ada Lovelace wrote the first program.".encode("utf-16-le"), "Ada Lovelace wrote the first program."),
    ("be16.txt", "Ada Lovelace wrote the first program.".encode("utf-16-be"), "Ada Lovelace wrote the first program."),
    ("bom32.txt", "Ada Lovelace wrote the first program.".encode("utf-32"), "Ada Lovelace wrote the first program."),
    ("cp1252.txt", "Ada\u2019s caf\u00e9 opened in 1843.".encode("cp1252"), "Ada\u2019s caf\u00e9 opened in 1843."),
])
def test_text_is_read_by_its_encoding(tmp_path, name, data, text):
    from pipeline.index.documents import read_folder

    (tmp_path / name).write_bytes(data)
    assert [p.text for p in read_folder(tmp_path, log=lambda line: None).passages] == [text]


def test_binary_data_is_judged_by_all_its_bytes_not_the_first_8_kb(tmp_path):
    import random

    from pipeline.index.documents import read_folder

    generator = random.Random(7)
    body = bytes(generator.choice([b for b in range(1, 256) if b not in (0x0A, 0x0D)]) for _ in range(40_000))
    (tmp_path / "a.txt").write_text("Ada Lovelace was a mathematician.")
    (tmp_path / "blob.txt").write_bytes(b"A plain first line of text.\n" * 400 + body)  # 11 KB of text, then binary with no NUL
    (tmp_path / "late-nul.md").write_bytes(b"# Notes\n\n" + b"Plain text. " * 1000 + b"\x00\x00binary tail")
    lines = []
    read = read_folder(tmp_path, log=lines.append)
    assert sorted(read.files) == ["a.txt"]
    assert any(line.startswith(f"{tmp_path / 'blob.txt'}: skipped: not a readable TXT file (binary data, not text (") and "control characters" in line
               for line in lines), lines
    assert f"{tmp_path / 'late-nul.md'}: skipped: not a readable MD file (binary data, not text (it holds NUL bytes))" in lines


def test_a_file_name_that_is_not_utf8_is_indexed_updated_and_deleted(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Ada Lovelace was a mathematician.")
    odd = os.fsencode(str(docs)) + b"/caf\xe9-notes.txt"
    with open(odd, "wb") as handle:
        handle.write(b"Charles Babbage was born in London.")
    code, out, err = run(capsys, "index", docs, "--out", tmp_path / "idx", "--embedder", "test-hash", "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "idx" / "passages.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(row["source"] for row in rows) == ["a.txt#0", "caf\\xe9-notes.txt#0"]
    code, out, err = run(capsys, "index", "--add", docs, "--into", tmp_path / "idx", "--embedder", "test-hash")
    assert code == 0 and "0 new or changed, 2 unchanged" in out, err
    code, out, err = run(capsys, "index", "--delete", os.fsdecode(odd), "--into", tmp_path / "idx", "--embedder", "test-hash")
    assert code == 0, err
    assert [json.loads(line)["source"] for line in (tmp_path / "idx" / "passages.jsonl").read_text().splitlines()] == ["a.txt#0"]


def test_pdfs_over_their_page_or_text_budget_are_one_line_each_never_a_stall(tmp_path):
    import time

    from pipeline.index.documents import Reading, read_folder

    (tmp_path / "a.txt").write_text("Ada Lovelace was a mathematician.")
    (tmp_path / "pages.pdf").write_bytes(page_tree_bomb())
    (tmp_path / "text.pdf").write_bytes(inflating_pdf(40))  # 40 MB of "(a) Tj": read, it took minutes
    assert len((tmp_path / "pages.pdf").read_bytes()) < 2048 and len((tmp_path / "text.pdf").read_bytes()) < 200_000
    lines, started = [], time.perf_counter()
    read = read_folder(tmp_path, log=lines.append)
    seconds = time.perf_counter() - started
    assert sorted(read.files) == ["a.txt"] and seconds < 20, seconds
    assert lines == [f"{tmp_path / 'pages.pdf'}: skipped: a PDF of more than 2000 pages, over the page budget (index.max_pdf_pages)",
                     f"{tmp_path / 'text.pdf'}: skipped: a PDF of more than 32 MB of page content to read, over the text budget (index.max_pdf_text_mb)"]
    # within its budgets a PDF is read whole
    (tmp_path / "small.pdf").write_bytes(inflating_pdf(0.1))
    assert "small.pdf" in read_folder(tmp_path, log=lambda line: None).files
    lines = []
    assert "small.pdf" not in read_folder(tmp_path, Reading(max_pdf_text_mb=0.05), log=lines.append).files
    assert f"{tmp_path / 'small.pdf'}: skipped: a PDF of more than 0.05 MB of page content to read, over the text budget (index.max_pdf_text_mb)" in lines


def test_a_file_over_the_size_budget_is_skipped_with_one_line(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Ada Lovelace was a mathematician.")
    (docs / "big.txt").write_text("Charles Babbage was born in London. " * 40_000)
    code, out, _ = run(capsys, "index", docs, "--out", tmp_path / "idx", "--embedder", "test-hash", "--max-file-mb", "1")
    assert code == 0 and f"{docs / 'big.txt'}: skipped: 1.4 MB, over the budget of 1 MB a file (index.max_file_mb)" in out


# --- recorded calls, --delete, outputs, the embedder, odd questions ------------------------------------------
def test_a_record_of_newlines_is_refused_in_bounded_memory(tmp_path):
    """310 KB of gzip'd newlines (320 MB inflated) under the 1 GiB cap: refused at its first empty
    line, in a few MB; read whole, it took 3.2 GB."""
    path = newline_record(tmp_path / "lm_calls.jsonl.gz")
    script = ("import sys; from pipeline.lm.record import read_record; from experiments.bench.attacks import peak_mb\n"
              "try:\n    read_record(sys.argv[1])\nexcept Exception as error:\n    print(error)\nprint(peak_mb())")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parent.parent)
    message, peak_mb = done.stdout.strip().splitlines()
    assert message == f"{path}: line 2 is not JSON (it is empty)" and int(peak_mb) < 400, done.stdout + done.stderr


def test_delete_resolves_a_name_against_the_index_folder_and_refuses_an_ambiguous_one(tmp_path, capsys, monkeypatch):
    docs, elsewhere = tmp_path / "docs", tmp_path / "elsewhere"
    docs.mkdir()
    elsewhere.mkdir()
    (docs / "a.txt").write_text("Ada Lovelace was a mathematician.")
    (docs / "b.txt").write_text("Charles Babbage was born in London.")
    (elsewhere / "b.txt").write_text("Another b.txt, of another folder.")
    assert run(capsys, "index", docs, "--out", tmp_path / "idx", "--embedder", "test-hash")[0] == 0
    monkeypatch.chdir(elsewhere)
    code, _, err = run(capsys, "index", "--delete", "b.txt", "--into", tmp_path / "idx", "--embedder", "test-hash")
    assert code == 2 and one_line(err) == (f"b.txt: names {elsewhere / 'b.txt'} here and also 1 document(s) of the index's folder "
                                           f"{docs}; give the full path of the one you mean")
    assert len((tmp_path / "idx" / "passages.jsonl").read_text().splitlines()) == 2  # nothing deleted
    code, _, err = run(capsys, "index", "--delete", "a.txt", "--into", tmp_path / "idx", "--embedder", "test-hash")  # not here: the index's
    assert code == 0, err
    assert [json.loads(line)["source"] for line in (tmp_path / "idx" / "passages.jsonl").read_text().splitlines()] == ["b.txt#0"]


def test_outputs_never_replace_a_file_the_project_did_not_write(files, capsys):
    bashrc = files / "bashrc"
    bashrc.write_text("export PATH=$HOME/bin:$PATH\n")
    code, _, err = run(capsys, "sweep", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--embedder", "test-hash", "--best-out", bashrc, "--trials", "1", "--no-track")
    assert code == 2 and one_line(err) == (f"--best-out {bashrc}: exists and is not a sweep's best config; this command replaces "
                                           "only an earlier one of its own (name a new file, or remove that one yourself)")
    code, _, err = run(capsys, "compile", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--embedder", "test-hash", "--out", bashrc, "--no-track")
    assert code == 2 and one_line(err).startswith(f"--out {bashrc}: exists and is not a compiled program; ")
    assert bashrc.read_text() == "export PATH=$HOME/bin:$PATH\n"


def test_reproduce_loads_no_embedder_folder_the_record_names(files, capsys, tracked):
    tracked["tamper"](lambda record: record["config"]["index"].update(embedder=str(files)))
    code, _, err = run(capsys, "reproduce", tracked["run"], "--tracking-uri", tracked["uri"], runtime=tracked["runtime"])
    assert code == 2 and one_line(err) == (f"run {tracked['run']}: its embedder {str(files)!r} names a folder on disk; reproducing it "
                                           "would load that folder as a model: check the record, then pass --trust-record")


def test_an_embedder_folder_that_is_no_model_is_one_line(files, capsys):
    code, _, err = run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "/etc",
                       runtime=lambda config: Runtime(config))
    assert code == 2 and one_line(err) == "embedder '/etc': not a sentence-transformers model folder (no modules.json or config.json in it)"


def test_a_question_that_is_not_text_is_one_line(served_index, capsys):
    code, _, err = run(capsys, "ask", served_index, "Who \udcff directed Jaws?", "--embedder", "test-hash")
    assert code == 2 and one_line(err) == "the question holds '\\udcff' at character 4, which is not text (a lone surrogate or a byte that is not UTF-8)"


def test_serve_gives_the_runtime_it_answers_with_the_lm_bounds_it_states(served_index, capsys):
    seen = []

    def runtime(config):
        seen.append(config.lm)
        raise HyperProveError("stopped before serving")

    code, _, err = run(capsys, "serve", served_index, "--embedder", "test-hash", "--api-base", "http://127.0.0.1:9/v1", runtime=runtime)
    assert code == 2 and one_line(err) == "stopped before serving"
    assert (seen[0].request_timeout, seen[0].request_retries, seen[0].give_up_seconds) == (120, 1, 241)
