"""Recorded LM calls: every LM run writes them, `reproduce` replays them without the LM, and a
tampered record or a request it lacks stops with one line.

The LM here is a real `dspy.LM` talking to a scripted OpenAI-compatible endpoint on a loopback
port, on each of DSPy's two engines: its native one (what the embedded model and any
OpenAI-compatible server get; it caches DSPy's own plain-data record of a call) and LiteLLM (what
a request with provider-specific settings such as `--deterministic` gets; it caches LiteLLM's chat
completion). Its calls pass the LM cache as a real run's do (DSPy's DummyLM bypasses the cache),
and the endpoint counts the calls that reached "the LM".
"""

import gzip
import hashlib
import json
import shutil

import dspy
import pytest

from pipeline.lm.record import CallRecord, departure, read_record
from pipeline.runtime import Runtime
from tests.support import QUESTIONS, HashEmbedder, ScriptedEndpoint, one_line, reply, rows, run, two_hop_script


@pytest.fixture(params=["auto", "litellm"])
def scripted(request):
    """The scripted LM on one of DSPy's engines: `scripted.completion.requests` counts what reached
    it; `scripted.runtime` makes a command's runtime with a `dspy.LM` that talks to it."""
    endpoint = ScriptedEndpoint(two_hop_script(final_answer="2017"))

    def runtime(config):
        lm = dspy.LM("openai/scripted", api_base=endpoint.address, api_key="none", num_retries=0, temperature=0.0, max_tokens=400,
                     engine=request.param)
        return Runtime(config, lm=lm, embedder=HashEmbedder())

    yield type("Scripted", (), {"completion": endpoint, "runtime": staticmethod(runtime), "engine": request.param})
    endpoint.server.shutdown()


def evaluate(capsys, files, scripted, out, *extra):
    code, stdout, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                            "--retriever", "hyperprove,dense", "--decomposition", "lm", "--embedder", "test-hash",
                            "--cache-dir", files / "cache", "--out", out, "--no-track", "--bridge-rewrite", "lm", "--json", *extra,
                            runtime=scripted.runtime)
    return code, stdout, err




def rewrite(path, rows_: list[dict], results=None) -> None:
    """Write a record file from rows (header first), and its sha256 into `results` (results.json) if given."""
    data = gzip.compress(("\n".join(json.dumps(r) for r in rows_) + "\n").encode(), mtime=0)
    path.write_bytes(data)
    if results is not None:
        record = json.loads(results.read_text())
        record["lm_calls"]["sha256"] = hashlib.sha256(data).hexdigest()
        results.write_text(json.dumps(record))


def test_an_lm_run_records_each_call_once_with_who_asked(files, capsys, scripted):
    code, _, err = evaluate(capsys, files, scripted, files / "first")
    assert code == 0, err
    results = json.loads((files / "first" / "results.json").read_text())
    header, *calls = rows(files / "first" / "lm_calls.jsonl.gz")
    # hyperprove: decompose, hop 1's answer, hop 2 rewritten then answered, the final answer; dense: its reader
    assert header == {"format": "hyperprove.lm_calls", "version": 1, "calls": 6}
    assert len(scripted.completion.requests) == 6
    assert [(a["system"], a["question"], a["step"]) for call in calls for a in call["asked_by"]] == [
        ("hyperprove", "q1", "Decomposer"), ("hyperprove", "q1", "HopAnswerer"), ("hyperprove", "q1", "BridgeRewriter"),
        ("hyperprove", "q1", "HopAnswerer"), ("hyperprove", "q1", "AnswerGenerator"), ("dense", "q1", "AnswerGenerator")]
    assert calls[0]["request"]["model"] == "openai/scripted" and calls[0]["request"]["temperature"] == 0.0
    assert {call["kind"] for call in calls} == {"dspy-lm15-result-v1" if scripted.engine == "auto" else "chat.completion"}
    assert "api_key" not in calls[0]["request"] and "api_base" not in calls[0]["request"]
    assert read_record(files / "first" / "lm_calls.jsonl.gz").reply(calls[1]["key"]) == reply({"answer": "Steven Spielberg", "supporting": [1]})
    data = (files / "first" / "lm_calls.jsonl.gz").read_bytes()
    assert results["lm_calls"] == {"file": "lm_calls.jsonl.gz", "calls": 6, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    # The same run again, answered by the LM cache: the same calls, the same bytes.
    code, _, _ = evaluate(capsys, files, scripted, files / "again")
    assert code == 0 and len(scripted.completion.requests) == 6
    assert (files / "again" / "lm_calls.jsonl.gz").read_bytes() == data


def test_reproduce_from_a_results_folder_replays_without_the_lm(files, capsys, scripted, monkeypatch):
    code, _, _ = evaluate(capsys, files, scripted, files / "first")
    assert code == 0
    shutil.rmtree(files / "cache")  # nothing cached: every answer must come from the record
    monkeypatch.chdir(files)
    code, out, err = run(capsys, "reproduce", files / "first", "--out", files / "again", "--no-track", "--json", runtime=scripted.runtime)
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["identical"] is True and len(scripted.completion.requests) == 6  # none new
    assert result["lm_calls"] == {"recorded": 6, "asked_again": 6, "new": 0} and "LM calls: 6 of the 6 recorded asked again, 0 new" in out
    assert "replaying its 6 recorded LM calls" in out
    assert "hyperprove: n 1 =, em 100 =, f1 100 =, recall@2 " in out and "reproduced " in out and ": every metric identical" in out
    # the reproduction recorded the same calls
    assert {r["key"] for r in rows(files / "again" / "lm_calls.jsonl.gz")[1:]} == {r["key"] for r in rows(files / "first" / "lm_calls.jsonl.gz")[1:]}


def test_an_index_whose_vectors_alone_differ_is_replayed_with_a_note_and_another_index_is_refused(files, capsys, scripted, monkeypatch):
    code, _, _ = evaluate(capsys, files, scripted, files / "first")
    assert code == 0
    monkeypatch.chdir(files)
    path = files / "first" / "index_manifest.json"
    manifest = json.loads(path.read_text())
    # the vectors as another CPU rounds them: the recorded checksums of the embeddings are not these
    path.write_text(json.dumps({**manifest, "files": {**manifest["files"], "fact_vectors.npy": {"sha256": "0" * 64, "bytes": 1}}}))
    code, out, err = run(capsys, "reproduce", files / "first", "--out", files / "again", "--no-track", "--json", runtime=scripted.runtime)
    assert code == 0, err
    assert "note: the index's vectors differ from the recorded checksums" in out and json.loads(out.strip().splitlines()[-1])["identical"] is True
    # another graph: refused
    path.write_text(json.dumps({**manifest, "files": {**manifest["files"], "synonyms.npy": {"sha256": "0" * 64, "bytes": 1}}}))
    code, _, err = run(capsys, "reproduce", files / "first", "--out", files / "again", "--no-track", runtime=scripted.runtime)
    assert code == 2 and "the index differs from the one" in one_line(err)


def test_a_tampered_record_is_caught_in_one_line(files, capsys, scripted, monkeypatch):
    code, _, _ = evaluate(capsys, files, scripted, files / "first")
    assert code == 0
    monkeypatch.chdir(files)
    record, results = files / "first" / "lm_calls.jsonl.gz", files / "first" / "results.json"
    header, *calls = rows(record)
    final = next(i for i, c in enumerate(calls) if c["asked_by"][0] == {"system": "hyperprove", "question": "q1", "step": "AnswerGenerator"})

    # A changed response, results.json left alone: the checksum differs.
    changed = json.loads(json.dumps(calls).replace("\\n2017\\n", "\\n1999\\n"))  # the final reply's answer field
    assert changed[final] != calls[final] and changed[:final] == calls[:final]
    rewrite(record, [header, *changed])
    code, _, err = run(capsys, "reproduce", files / "first", "--no-track", runtime=scripted.runtime)
    assert code == 2 and one_line(err) == f"{record}: differs from the record its results.json names (sha256 mismatch): edited or damaged; not replaying"

    # The same change with the checksum made to match: replayed, and the metric shows the change.
    rewrite(record, [header, *changed], results)
    code, out, err = run(capsys, "reproduce", files / "first", "--no-track", "--json", runtime=scripted.runtime)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["identical"] is False
    assert "hyperprove: n 1 =, em 100 -100, f1 100 -100," in out and "metrics differ" in out

    # A removed call (header and checksum made to match): the rerun stops where it would ask it.
    rewrite(record, [{**header, "calls": 5}, *calls[:final], *calls[final + 1:]], results)
    shutil.rmtree(files / "cache")
    code, _, err = run(capsys, "reproduce", files / "first", "--no-track", runtime=scripted.runtime)
    assert code == 2
    message = one_line(err.splitlines(keepends=True)[-1])  # after the progress bar
    # dense's final read is the nearest: the same step and question, another evidence list
    assert message.startswith(f"an LM call not in the record {record}: LM module AnswerGenerator, question q1 (system hyperprove); "
                              "the nearest recorded request (same question and LM module) differs in message ")
    assert "(user) at character " in message and "now '## evidence ## ]]\\n[\"Who directed Jaws? -> Steven Spielberg\"" in message
    assert message.endswith("; pass --live to send new calls to the LM") and len(scripted.completion.requests) == 6

    # A removed call with the header left alone, and a request edited in place.
    rewrite(record, [header, *calls[1:]], results)
    code, _, err = run(capsys, "reproduce", files / "first", "--no-track", runtime=scripted.runtime)
    assert code == 2 and one_line(err) == f"{record}: its header says 6 calls, it holds 5"
    edited = json.loads(json.dumps(calls))
    edited[0]["request"]["temperature"] = 0.7
    rewrite(record, [header, *edited], results)
    code, _, err = run(capsys, "reproduce", files / "first", "--no-track", runtime=scripted.runtime)
    assert code == 2 and one_line(err) == f"{record}: line 2: its request does not give its key, or the key is there twice (edited?)"


def test_replay_with_live_asks_only_the_calls_an_option_changes(files, capsys, scripted):
    code, _, _ = evaluate(capsys, files, scripted, files / "first")
    assert code == 0 and len(scripted.completion.requests) == 6
    shutil.rmtree(files / "cache")
    # Another final-reader evidence changes the final reader's prompt only: strict replay stops there...
    code, _, err = evaluate(capsys, files, scripted, files / "option", "--replay", files / "first", "--reader-evidence", "passages")
    assert code == 2
    assert one_line(err.splitlines(keepends=True)[-1]).startswith(f"an LM call not in the record {files / 'first' / 'lm_calls.jsonl.gz'}: LM module AnswerGenerator, "
                                    "question q1 (system hyperprove); the nearest recorded request (same question and LM module) differs in message ")
    assert len(scripted.completion.requests) == 6
    # ... and with --live that one call goes to the LM, the five shared ones come from the record.
    code, out, err = evaluate(capsys, files, scripted, files / "option", "--replay", files / "first", "--reader-evidence", "passages", "--live")
    assert code == 0, err
    assert len(scripted.completion.requests) == 7
    assert "[[ ## evidence ## ]]" in scripted.completion.requests[-1][-1]["content"]
    assert json.loads(out.strip().splitlines()[-1])["retrievers"]["hyperprove"]["em"] == 100.0
    assert rows(files / "option" / "lm_calls.jsonl.gz")[0]["calls"] == 6  # its own record: 5 shared + 1 new
    summary = json.loads((files / "option" / "results.json").read_text())["lm_calls"]
    assert summary["calls"] == 6 and summary["replayed"] == {"from": str(files / "first" / "lm_calls.jsonl.gz"), "calls": 5}
    assert f"the 6 LM calls (5 replayed from {files / 'first' / 'lm_calls.jsonl.gz'}), " in out
    from experiments.tools.compare import compare

    lines = compare(f"{files / 'option'}:hyperprove", f"{files / 'first'}:hyperprove", ["em"])
    assert lines[0] == "LM calls: 6 and 6 recorded; 5 requests in both, 5 of them with the same reply"


def test_departure_names_the_first_difference():
    recorded = {"model": "m", "temperature": 0.0, "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Who directed Jaws?"}]}
    assert departure(recorded, {**recorded, "temperature": 0.7}) == "differs in temperature: recorded '0.0', now '0.7'"
    asked = {**recorded, "messages": [recorded["messages"][0], {"role": "user", "content": "Who produced Jaws?"}]}
    assert departure(recorded, asked, width=8) == "differs in message 1 (user) at character 4: recorded 'o directed', now 'o produced'"
    assert departure(recorded, {**recorded, "messages": recorded["messages"][:1]}) == "has 2 messages, this one 1"


def test_a_record_file_is_the_same_bytes_for_the_same_calls_and_reads_back(tmp_path):
    from litellm import ModelResponse

    from pipeline.lm.cache import response_data

    reply_row = response_data(ModelResponse(model="m", choices=[{"index": 0, "message": {"role": "assistant", "content": "x"}}]))
    from dspy.clients.cache import Cache

    request = {"model": "m", "messages": [{"role": "user", "content": "q"}], "_fn_identifier": "f"}
    key = Cache(enable_disk_cache=False, enable_memory_cache=False, disk_cache_dir=None).cache_key(request)
    one, two = CallRecord(), CallRecord()
    for record in (one, two):
        record.add([{"key": key, "asked_by": [{"system": "s", "question": "q1", "step": "Decomposer"}], "request": request, **reply_row}])
        record.add([{"key": key, "asked_by": [{"system": "t", "question": "q1", "step": "Decomposer"}], "request": request, **reply_row}])
    assert one.to_bytes() == two.to_bytes() and len(one) == 1
    summary = one.write(tmp_path / "lm_calls.jsonl.gz")
    assert summary["calls"] == 1 and summary["sha256"] == hashlib.sha256((tmp_path / "lm_calls.jsonl.gz").read_bytes()).hexdigest()
    loaded = read_record(tmp_path / "lm_calls.jsonl.gz")
    assert [a["system"] for a in loaded.calls[key]["asked_by"]] == ["s", "t"]
    assert loaded.reply(key) == "x"
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(Exception, match="not a gzip'd JSON lines record of LM calls"):
        read_record(tmp_path / "bad.jsonl.gz")


def test_compile_writes_its_lm_calls_beside_the_program(files, capsys, scripted):
    from tests.support import TRAIN

    (files / "train.json").write_text(json.dumps(TRAIN))
    scripted.completion.script = {
        TRAIN[0]["question"]: {"sub_questions": ["Who directed Jaws?", "Who was the mother of #1?"]},
        TRAIN[1]["question"]: {"sub_questions": [TRAIN[1]["question"]]},
        QUESTIONS[0]["question"]: {"sub_questions": ["Who directed Jaws?", "Who is the mother of #1?", "When did #2 die?"]},
    }
    code, out, err = run(capsys, "compile", "--questions", files / "train.json", "--corpus", files / "corpus.json", "--train", 2, "--val", 1,
                         "--demos", 1, "--labeled-demos", 1, "--out", files / "decompose.json", "--cache-dir", files / "cache",
                         "--no-track", "--json", runtime=scripted.runtime)
    assert code == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    header, *calls = rows(files / "decompose.lm_calls.jsonl.gz")
    # every request that reached the LM, once: the validation question graded before, t1 bootstrapped
    # (t2 is a labeled demonstration, asked nothing), the validation question again with the new demonstrations
    assert header["calls"] == report["lm_record"]["calls"] == len(scripted.completion.requests) == len(calls)
    assert {a["step"] for call in calls for a in call["asked_by"]} == {"Decomposer"}
    asked = [call["request"]["messages"][-1]["content"] for call in calls]
    assert [TRAIN.index(next(e for e in TRAIN if f"\n{e['question']}\n" in text)) for text in asked] == [2, 0, 2]


def test_an_interrupted_run_keeps_the_calls_of_its_finished_systems(files, capsys, scripted, monkeypatch):
    import experiments.harness

    code, _, _ = evaluate(capsys, files, scripted, files / "whole")
    assert code == 0
    shutil.rmtree(files / "cache")
    evaluate_program, started = experiments.harness.evaluate_program, []

    def interrupted_at_dense(questions, program, **kw):
        started.append(kw["system"])
        if kw["system"] == "dense" and started.count("dense") == 1:
            raise KeyboardInterrupt
        return evaluate_program(questions, program, **kw)

    monkeypatch.setattr(experiments.harness, "evaluate_program", interrupted_at_dense)
    code, _, _ = evaluate(capsys, files, scripted, files / "resumed")
    assert code == 130 and rows(files / "resumed.partial" / "lm_calls.jsonl.gz")[0]["calls"] == 5
    shutil.rmtree(files / "cache")  # hyperprove's calls now live only in the partial record
    code, out, _ = evaluate(capsys, files, scripted, files / "resumed")
    assert code == 0 and "resuming: hyperprove finished earlier" in out and started == ["hyperprove", "dense", "dense"]
    # the resumed run's record holds the uninterrupted run's calls, in the same order, asked by the same
    # (the responses are new ones: the LM was asked again, and a completion has its own id)
    def asked(path):
        return [(call["key"], call["asked_by"]) for call in rows(path)[1:]]

    assert asked(files / "resumed" / "lm_calls.jsonl.gz") == asked(files / "whole" / "lm_calls.jsonl.gz")
    assert len(asked(files / "whole" / "lm_calls.jsonl.gz")) == 6


def test_a_tracked_run_logs_its_calls_and_reproduces_by_its_id(files, capsys, scripted, monkeypatch):
    monkeypatch.chdir(files)
    uri = f"sqlite:///{files}/mlflow.db"
    code, out, _ = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "hyperprove,dense", "--decomposition", "lm", "--embedder", "test-hash", "--cache-dir", files / "cache",
                       "--out", files / "first", "--tracking-uri", uri, "--no-trace", "--bridge-rewrite", "lm", "--json", runtime=scripted.runtime)
    assert code == 0
    run_id = json.loads(out.strip().splitlines()[-1])["mlflow_run"]
    (logged,) = [p for p in (files / ".hyperprove" / "mlartifacts").rglob("lm_calls.jsonl.gz") if run_id in str(p)]
    assert logged.read_bytes() == (files / "first" / "lm_calls.jsonl.gz").read_bytes()
    shutil.rmtree(files / "cache")
    code, out, err = run(capsys, "reproduce", run_id, "--tracking-uri", uri, "--no-trace", "--json", runtime=scripted.runtime)
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["identical"] is True and result["lm_calls"] == {"recorded": 6, "asked_again": 6, "new": 0}
    assert len(scripted.completion.requests) == 6


def test_replay_names_what_is_wrong_with_the_record_it_is_given(files, capsys, scripted):
    code, _, _ = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--retriever", "dense",
                     "--embedder", "test-hash", "--cache-dir", files / "cache", "--out", files / "gold", "--no-track")
    assert code == 0 and not (files / "gold" / "lm_calls.jsonl.gz").exists()
    code, _, err = evaluate(capsys, files, scripted, files / "again", "--replay", files / "gold")
    assert code == 2 and one_line(err) == (f"{files / 'gold'}/results.json: names no recorded LM calls "
                                           "(an evaluation without the LM, or made before runs recorded their calls)")
    code, _, err = evaluate(capsys, files, scripted, files / "again", "--replay", files / "nowhere.jsonl.gz")
    assert code == 2 and one_line(err) == f"{files / 'nowhere.jsonl.gz'}: no recorded LM calls here"
    # an LM object that bypasses DSPy's cache (DummyLM does) can neither record nor replay
    code, _, _ = evaluate(capsys, files, scripted, files / "first")
    assert code == 0
    from dspy.utils import DummyLM

    code, _, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "hyperprove", "--decomposition", "lm", "--embedder", "test-hash", "--cache-dir", files / "cache",
                       "--out", files / "dummy", "--no-track", "--replay", files / "first",
                       runtime=lambda config: Runtime(config, lm=DummyLM({}), embedder=HashEmbedder()))
    assert code == 2 and one_line(err) == f"--replay {files / 'first'}: the LM given (dummy) does not use DSPy's cache, so its calls cannot be replayed"


def test_replay_of_several_records_answers_from_each(files, capsys, scripted):
    # a run measured in parts: dense's reader in one record, hyperprove's calls in another
    code, _, _ = evaluate(capsys, files, scripted, files / "first")
    assert code == 0 and len(scripted.completion.requests) == 6
    header, *calls = rows(files / "first" / "lm_calls.jsonl.gz")
    dense = [call for call in calls if call["asked_by"][0]["system"] == "dense"]
    (files / "parts").mkdir()
    rewrite(files / "parts" / "a.jsonl.gz", [{**header, "calls": 5}, *[call for call in calls if call not in dense]])
    rewrite(files / "parts" / "b.jsonl.gz", [{**header, "calls": 1}, *dense])
    shutil.rmtree(files / "cache")
    # either part alone stops at a call the other holds
    code, _, err = evaluate(capsys, files, scripted, files / "one", "--replay", files / "parts" / "a.jsonl.gz")
    assert code == 2 and "LM module AnswerGenerator, question q1 (system dense)" in one_line(err.splitlines(keepends=True)[-1])
    parts = f"{files / 'parts' / 'a.jsonl.gz'}, {files / 'parts' / 'b.jsonl.gz'}"
    code, out, err = evaluate(capsys, files, scripted, files / "both", "--replay", parts)
    assert code == 0, err
    assert len(scripted.completion.requests) == 6  # none new
    summary = json.loads((files / "both" / "results.json").read_text())["lm_calls"]
    assert summary["calls"] == 6 and summary["replayed"] == {"from": parts, "calls": 6}
    assert {r["key"] for r in rows(files / "both" / "lm_calls.jsonl.gz")[1:]} == {call["key"] for call in calls}
