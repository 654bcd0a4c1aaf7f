"""What a user sees when LM caches, call records and reproduce: stale, tampered and hostile records: each case ends in one line naming the problem
(exit 2) or in preserved state, never in a traceback, a lost folder or a silently wrong result."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.bench.attacks import newline_record
from pipeline.runtime import Runtime
from tests.support import HashEmbedder, one_line, run, two_hop_script


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


def test_a_storage_that_is_not_a_url_is_one_line(files, capsys):
    code, _, err = run(capsys, "sweep", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--embedder", "test-hash",
                       "--storage", "notaurl://x", "--no-track", "--cache-dir", files / "cache", "--out", files / "sweep")
    assert code == 2 and one_line(err).startswith("--storage notaurl://x: Optuna cannot open it (")


def test_a_reused_out_keeps_nothing_of_the_earlier_run(files, capsys):
    common = ["evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--embedder", "test-hash",
              "--no-track", "--cache-dir", files / "cache", "--out", files / "results"]
    assert run(capsys, *common, "--retriever", "ppr")[0] == 0
    assert (files / "results" / "index_manifest.json").exists()
    assert run(capsys, *common, "--retriever", "dense")[0] == 0  # passage-level: no index
    assert sorted(p.name for p in (files / "results").iterdir()) == ["predictions.json", "results.json", "results.md"]


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


def test_reproduce_loads_no_embedder_folder_the_record_names(files, capsys, tracked):
    tracked["tamper"](lambda record: record["config"]["index"].update(embedder=str(files)))
    code, _, err = run(capsys, "reproduce", tracked["run"], "--tracking-uri", tracked["uri"], runtime=tracked["runtime"])
    assert code == 2 and one_line(err) == (f"run {tracked['run']}: its embedder {str(files)!r} names a folder on disk; reproducing it "
                                           "would load that folder as a model: check the record, then pass --trust-record")
