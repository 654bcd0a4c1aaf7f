"""What a user sees when configs, program files, sweeps and compile: shared files are data, outputs never replace a stranger's file: each case ends in one line naming the problem
(exit 2) or in preserved state, never in a traceback, a lost folder or a silently wrong result."""

import json
from pathlib import Path

import pytest

from modules.errors import HyperProveError
from pipeline.runtime import Runtime
from tests.support import CORPUS, HashEmbedder, dead_pid, one_line, run, score_alpha


def test_line_separators_inside_a_passage_survive_the_round_trip(files, capsys):
    corpus = [{"title": "Odd", "text": "One\u2028two\u2029three\x85four. Five."}, *CORPUS]
    (files / "odd.json").write_text(json.dumps(corpus))
    assert run(capsys, "index", files / "odd.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    from pipeline.index.store import load_index

    assert load_index(files / "idx").passages[0].text == "One\u2028two\u2029three\x85four. Five."


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


def test_sweep_ranges_outside_the_retriever_are_refused_with_the_config():
    from pipeline.config import SweepConfig

    with pytest.raises(HyperProveError, match=r"^sweep config: alpha=\[0.0, 2.0\] reaches 2.0, outside the retriever's range for alpha$"):
        SweepConfig(alpha=[0, 2])
    with pytest.raises(HyperProveError, match=r"^sweep config: top_k=\[0, 4\] reaches 0, outside the retriever's range for top_k$"):
        SweepConfig(top_k=[0, 4])


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


def test_json_nested_too_deeply_is_one_line(files, capsys):
    (files / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = run(capsys, "index", files / "deep.json", "--out", files / "idx", "--embedder", "test-hash")
    assert code == 2 and one_line(err) == f"{files / 'deep.json'}: JSON nested too deeply to be a corpus file"


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
    from pipeline.sharing import check_shared

    configs = sorted(Path("experiments/configs").rglob("*.json"))
    assert len(configs) > 50
    for path in configs:  # none sets a host, an outside path or a model folder
        check_shared(json.loads(path.read_text()), HyperProveConfig().to_dict(), str(path))


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


def test_a_file_over_the_size_budget_is_skipped_with_one_line(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Ada Lovelace was a mathematician.")
    (docs / "big.txt").write_text("Charles Babbage was born in London. " * 40_000)
    code, out, _ = run(capsys, "index", docs, "--out", tmp_path / "idx", "--embedder", "test-hash", "--max-file-mb", "1")
    assert code == 0 and f"{docs / 'big.txt'}: skipped: 1.4 MB, over the budget of 1 MB a file (index.max_file_mb)" in out


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
