"""The command line: one-line errors on bad input, and a smoke run with the real embedder."""

import hashlib
import json
import shutil

import pytest

from experiments.bench.check_pages import Rendered as Page
from experiments.runs.failures import STAGES
from pipeline.cli import main
from tests.support import CORPUS, QUESTIONS, TRAIN, Scripted, two_hop_script


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bad_corpus_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps([{"title": "x"}]))
    code, out, err = run(capsys, "index", tmp_path / "bad.json", "--out", tmp_path / "idx")
    assert code == 2
    assert err.strip() == f'error: {tmp_path / "bad.json"}: item 0: field "text" is missing'
    assert not (tmp_path / "idx").exists()


def test_bad_index_and_retriever_and_config(files, capsys):
    code, _, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "dense", "--index", files / "nowhere")
    assert code == 2 and "no such index directory" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--retriever", "magic")
    assert code == 2 and "--retriever 'magic'" in err
    (files / "cfg.json").write_text(json.dumps({"retriever": {"alpha": 7}}))
    code, _, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "hyperprove", "--config", files / "cfg.json")
    assert code == 2 and err == f"error: {files / 'cfg.json'}: retriever config: alpha=7 must lie in [0.0, 1.0]\n"


ALL_SYSTEMS = "dense,bm25,ppr,proprag,dense-facts,hypergraphrag,hyperprove-fixed,dense-iterative,hyperprove"


@pytest.mark.slow
def test_index_then_evaluate_every_system_in_one_tracked_run(files, capsys):
    from mlflow.tracking import MlflowClient

    code, out, _ = run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--cache-dir", files / "cache", "--json")
    assert code == 0
    assert json.loads(out.strip().splitlines()[-1])["passages"] == 5
    uri = f"sqlite:///{files}/mlflow.db"
    code, out, _ = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--index", files / "idx", "--retriever", ALL_SYSTEMS, "--top-k", 1, "--cache-dir", files / "cache",
                       "--out", files / "results", "--tracking-uri", uri, "--json")
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    systems = result["retrievers"]
    assert list(systems) == ALL_SYSTEMS.split(",")
    assert all({"n", "recall@2", "recall@5", "seconds_per_question"} <= set(s) for s in systems.values())
    assert systems["dense-iterative"]["recall@5"] == 100.0 and systems["hyperprove"]["recall@5"] == 100.0

    results = files / "results"
    assert "| proprag | 1 |" in (results / "results.md").read_text()
    # one question of MuSiQue's type "3hop1", reported as "3hop": its type's scores are the run's
    assert all(s["per_type"] == {"3hop": {"n": 1, "recall@2": s["recall@2"], "recall@5": s["recall@5"]}} for s in systems.values())
    assert "## Recall@2 by question type\n\n| system | 3hop (1) |" in (results / "results.md").read_text()
    recorded = json.loads((results / "results.json").read_text())
    assert recorded["config"]["retriever"]["top_k"] == 1 and recorded["systems"]["ppr"] == systems["ppr"]
    assert recorded["data_sha256"]["corpus"] == hashlib.sha256((files / "corpus.json").read_bytes()).hexdigest()
    assert recorded["mlflow_run"] == result["mlflow_run"]
    predictions = json.loads((results / "predictions.json").read_text())
    hops = predictions["hyperprove"][0]["chain"]
    assert [hop["query"] for hop in hops] == ["Who directed Jaws?", "Who was the mother of Steven Spielberg?", "When did Leah Adler die?"]
    manifest = json.loads((files / "idx" / "manifest.json").read_text())
    assert json.loads((results / "index_manifest.json").read_text()) == manifest

    client = MlflowClient(tracking_uri=uri)
    tracked = client.get_run(result["mlflow_run"])
    assert tracked.data.params["retriever.top_k"] == "1"
    assert tracked.data.params["evaluation.retrievers"] == json.dumps(ALL_SYSTEMS.split(","))
    assert tracked.data.metrics["hyperprove.recall_at_5"] == 100.0
    assert tracked.data.metrics["ppr.recall_at_2"] == systems["ppr"]["recall@2"]
    assert tracked.data.metrics["hyperprove.3hop.recall_at_5"] == 100.0
    assert len(tracked.data.tags["git_commit"]) == 40
    artifacts = {a.path for a in client.list_artifacts(tracked.info.run_id)}
    assert artifacts == {"results.md", "results.json", "predictions.json", "index_manifest.json", "environment.json"}


def test_evaluate_rejects_unknown_systems_and_gold_decomposition_without_one(files, capsys, tmp_path):
    (tmp_path / "q.json").write_text(json.dumps([{**QUESTIONS[0], "decomposition": []}]))
    code, _, err = run(capsys, "evaluate", "--questions", tmp_path / "q.json", "--corpus", files / "corpus.json",
                       "--retriever", "dense,magic")
    assert code == 2 and err.startswith("error: --retriever 'magic': choose from dense, bm25") and len(err.splitlines()) == 1
    code, _, err = run(capsys, "evaluate", "--questions", tmp_path / "q.json", "--corpus", files / "corpus.json",
                       "--retriever", "hyperprove", "--no-track")
    assert code == 2 and "hyperprove with --decomposition gold needs gold sub-questions; question q1 has none" in err
    code, _, err = run(capsys, "evaluate", "--corpus", files / "corpus.json", "--retriever", "dense")
    assert code == 2 and "give --questions and --corpus" in err




@pytest.fixture
def scripted_cli():
    return Scripted()


def run_scripted(capsys, scripted, *argv):
    code = main([str(a) for a in argv], make_runtime=scripted)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ask_prints_the_chain_and_ends_with_json(files, capsys, scripted_cli):
    scripted_cli.answers = {
        "`[[ ## sub_questions ## ]]`": {"sub_questions": ["Who directed Jaws?", "Who was the mother of #1?"]},
        "[[ ## sub_question ## ]]": {"question": "Who was the mother of Steven Spielberg?"},
        "[[ ## question ## ]]\nWho directed Jaws?\n": {"answer": "Steven Spielberg", "supporting": [1]},
        "[[ ## question ## ]]\nWho was the mother of Steven Spielberg?\n": {"answer": "Leah Adler", "supporting": [1]},
        "[[ ## question ## ]]\nWho was the mother of the director of Jaws?": {"answer": "Leah Adler"},
    }
    code, _, _ = run_scripted(capsys, scripted_cli, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")
    assert code == 0
    uri = f"sqlite:///{files}/mlflow.db"
    code, out, _ = run_scripted(capsys, scripted_cli, "ask", files / "idx", "Who was the mother of the director of Jaws?", "--embedder", "test-hash",
                                "--tracking-uri", uri, "--json", "--bridge-rewrite", "lm")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == "Q: Who was the mother of the director of Jaws?"
    assert "  hop 2: Who was the mother of #1?" in lines
    assert "    rewritten: Who was the mother of Steven Spielberg?" in lines
    assert lines[-3] == "A: Leah Adler" and lines[-2].startswith("trace: in MLflow experiment 'hyperprove' of sqlite:///")
    result = json.loads(lines[-1])
    assert result["answer"] == "Leah Adler" and result["lm_calls"] == 5
    # the question is one MLflow trace: the program's modules in the order they ran, an LM span per call
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (trace,) = client.search_traces(locations=[client.get_experiment_by_name("hyperprove").experiment_id])
    spans = {span.span_id: span for span in trace.data.spans}
    root = next(span for span in spans.values() if span.parent_id is None)
    program = next(span for span in spans.values() if span.parent_id == root.span_id)
    steps = sorted((span for span in spans.values() if span.parent_id == program.span_id), key=lambda span: span.start_time_ns)
    assert (root.name, root.inputs, root.outputs, program.name) == (
        "hyperprove", {"question": "Who was the mother of the director of Jaws?"}, {"answer": "Leah Adler"}, "HyperProve.forward")
    # the whole question's search (the question channel) comes first, then the plan and each hop
    assert [span.name.split(".")[0] for span in steps] == ["HypergraphRetriever", "Decomposer", "BridgeRewriter", "HypergraphRetriever", "HopAnswerer",
                                                           "BridgeRewriter", "HypergraphRetriever", "HopAnswerer", "AnswerGenerator"]
    retrieve = steps[3].outputs  # the first hop's retrieval carries the retriever's own trace
    assert {"dense_seeds", "frontier_in", "subgraph_size", "subgraph_edges", "candidates"} <= set(retrieve["trace"])
    assert sum(span.span_type == "CHAT_MODEL" for span in spans.values()) == 5
    # each call's bill sits on the Predict span that made it (the scripted LM reports no tokens: zeros)
    billed = sorted((span for span in spans.values() if "hyperprove.step" in (span.attributes or {})), key=lambda span: span.start_time_ns)
    assert [span.attributes["hyperprove.step"] for span in billed] == ["Decomposer", "HopAnswerer", "BridgeRewriter", "HopAnswerer", "AnswerGenerator"]
    assert all(span.attributes["lm.prompt_tokens"] == 0 and span.attributes["lm.cache_hit"] is False for span in billed)
    # --html writes the same chain as a page
    code, out, _ = run_scripted(capsys, scripted_cli, "ask", files / "idx", "Who was the mother of the director of Jaws?", "--embedder", "test-hash",
                                "--html", files / "chain.html", "--no-track")
    assert code == 0 and f"evidence chain: {files / 'chain.html'}" in out
    page = Page((files / "chain.html").read_text())
    assert page.classes["hop-answer"] == ["Steven Spielberg", "Leah Adler"] and page.classes["query"] == ["Who was the mother of Steven Spielberg?"]
    code, _, err = run_scripted(capsys, scripted_cli, "ask", files / "idx", "Who?", "--embedder", "test-hash", "--html", files, "--no-track")
    assert code == 2 and err == f"error: --html {files}: is a folder; name the page file to write\n"
    assert {step: cost["calls"] for step, cost in result["lm_steps"].items()} == {"Decomposer": 1, "BridgeRewriter": 1, "HopAnswerer": 2, "AnswerGenerator": 1}
    assert [hop["answer"] for hop in result["chain"]] == ["Steven Spielberg", "Leah Adler"]
    assert result["chain"][1]["frontier_in"] == result["chain"][0]["supporting"]
    code, out, _ = run_scripted(capsys, scripted_cli, "ask", files / "idx", "Who was the mother of the director of Jaws?", "--embedder", "test-hash", "--profile",
                                "--no-track")
    assert code == 0
    profile = out[out.index("| LM module | calls |"):].splitlines()
    # the default fills #1 by rule: no BridgeRewriter call
    assert [line.split(" | ")[:2] for line in profile[2:]] == [["| Decomposer", "1"], ["| HopAnswerer", "2"], ["| AnswerGenerator", "1"],
                                                                  ["| total", "4"]]


def test_demo_reports_every_extraction_fallback(tmp_path, capsys, scripted_cli):
    # An LM that never gives usable facts: every demo passage falls back to sentences, and says so.
    scripted_cli.answers = {"": {"entities": [], "facts": [], "sub_questions": [], "question": "", "answer": "", "supporting": []}}
    code, out, _ = run_scripted(capsys, scripted_cli, "demo", "--cache-dir", tmp_path / "cache", "--no-track", "--json")
    assert code == 0
    assert "lm extraction: 12 passages, 0 from the cache, 0 extracted, 12 retried, 12 fell back to sentences" in out
    result = json.loads(out.strip().splitlines()[-1])
    assert len(result["answers"]) == 3
    assert all(answer["fallbacks"][0].startswith("decompose:") for answer in result["answers"])
    assert not (tmp_path / "cache" / "indexes").exists()  # an index built on fallbacks is not kept


def test_an_lm_provider_failure_is_one_line(files, capsys):
    from pipeline.runtime import Runtime

    class AuthenticationError(Exception):
        __module__ = "litellm.exceptions"

    class NoKey(Runtime):
        @property
        def session(self):
            raise AuthenticationError("litellm.AuthenticationError: OpenAIException - The api_key client option must be set\nmore detail")

    code, _, err = run_scripted(capsys, NoKey, "demo", "--lm", "openai/gpt-4o-mini", "--cache-dir", files / "cache")
    assert code == 2
    assert err == "error: the LM failed (AuthenticationError): litellm.AuthenticationError: OpenAIException - The api_key client option must be set\n"




def test_evaluate_with_the_lm_runs_the_program_first_and_reads_every_system(files, capsys, scripted_cli, tmp_path):
    scripted_cli.answers = two_hop_script(final_answer="2017")
    code, out, _ = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "dense-iterative,dense,hyperprove,hyperprove-passages", "--decomposition", "lm",
                       "--embedder", "test-hash", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "results", "--no-track", "--json",
                       "--bridge-rewrite", "lm")
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    systems = result["retrievers"]
    assert list(systems) == ["dense-iterative", "dense", "hyperprove", "hyperprove-passages"] and result["mlflow_run"] is None
    # hyperprove: decompose, one rewrite (hop 2 has a #1), two hop answers, the final answer
    assert systems["hyperprove"]["lm_calls_per_question"] == 5 and systems["hyperprove"]["em"] == 100.0
    assert {step: cost["calls"] for step, cost in systems["hyperprove"]["lm_steps"].items()} == {
        "Decomposer": 1, "BridgeRewriter": 1, "HopAnswerer": 2, "AnswerGenerator": 1}
    assert systems["dense"]["lm_calls_per_question"] == 1 and systems["dense"]["em"] == 100.0
    assert {step: cost["calls"] for step, cost in systems["dense"]["lm_steps"].items()} == {"AnswerGenerator": 1}
    assert systems["dense-iterative"]["lm_calls_per_question"] == 1
    predictions = json.loads((tmp_path / "results" / "predictions.json").read_text())
    # hyperprove-passages: the program's own top 5 passages, one reader call
    assert systems["hyperprove-passages"]["lm_calls_per_question"] == 1 and systems["hyperprove-passages"]["em"] == 100.0
    assert predictions["hyperprove-passages"][0]["passages"] == predictions["hyperprove"][0]["passages"][:5]
    queries = [hop["query"] for hop in predictions["hyperprove"][0]["chain"]]
    assert queries == ["Who directed Jaws?", "Who was the mother of Steven Spielberg?"]
    # dense-iterative searched those two queries: its passages are their dense rankings interleaved
    from experiments.gold import DensePassageSearch
    from modules.retrieval.retriever import interleave_passages
    from modules.retrieval.vectors import VectorIndex
    from tests.support import HashEmbedder

    embedder = HashEmbedder()
    search = DensePassageSearch(VectorIndex.build(embedder.encode([f"{p['title']}\n{p['text']}" for p in CORPUS])), embedder.encode_query)
    assert predictions["dense-iterative"][0]["passages"] == interleave_passages([search(q) for q in queries])[:5]
    table = (tmp_path / "results" / "results.md").read_text()
    assert "| hyperprove | 1 | " in table and "## hyperprove: LM modules, per question" in table and "| HopAnswerer | 2 | 0 |" in table
    # every answer right, so no stage failed; an evidence-chain page per system and question, with indexes
    assert systems["hyperprove"]["failures"] == {"right": 1, **{stage: {"n": 0, "examples": []} for stage in STAGES}}
    assert "| hyperprove | 1 | 0 | 0 | 0 | 0 |" in table
    pages = tmp_path / "results" / "pages"
    assert sorted(p.name for p in pages.iterdir()) == ["dense", "dense-iterative", "hyperprove", "hyperprove-passages", "index.html"]
    page = Page((pages / "hyperprove" / "q1.html").read_text())
    assert [i for i in page.ids if i.startswith("hop-") and "fact" not in i] == ["hop-1", "hop-2"]
    assert page.classes["hop-answer"] == ["Steven Spielberg", "Leah Adler"] and page.classes["right"] == ["(right)"]
    # `hyperprove pages` writes the same pages again from the folder's predictions and data files
    written = {str(p.relative_to(pages)): p.read_bytes() for p in pages.rglob("*.html")}
    code, out, _ = run_scripted(capsys, scripted_cli, "pages", tmp_path / "results", "--out", tmp_path / "again", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["questions"] == 4
    assert {str(p.relative_to(tmp_path / "again")): p.read_bytes() for p in (tmp_path / "again").rglob("*.html")} == written
    edited = json.loads((tmp_path / "results" / "results.json").read_text())
    edited["data_sha256"]["questions"] = "0" * 64  # as if the questions file had changed since
    shutil.copytree(tmp_path / "results", tmp_path / "edited")
    (tmp_path / "edited" / "results.json").write_text(json.dumps(edited))
    code, _, err = run_scripted(capsys, scripted_cli, "pages", tmp_path / "edited")
    assert code == 2 and "sha256 mismatch" in err and err.count("\n") == 1
    # With --no-read the baselines only rank: no reader calls, the same passages.
    code, out, _ = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "dense-iterative,hyperprove", "--decomposition", "lm", "--no-read",
                       "--embedder", "test-hash", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "ranked", "--no-track", "--json")
    assert code == 0
    ranked = json.loads(out.strip().splitlines()[-1])["retrievers"]["dense-iterative"]
    assert "lm_calls_per_question" not in ranked and "em" not in ranked
    rows = json.loads((tmp_path / "ranked" / "predictions.json").read_text())["dense-iterative"]
    assert rows[0]["passages"] == predictions["dense-iterative"][0]["passages"]
    assert rows[0]["chain"] == [{"query": q} for q in queries]


def test_an_interrupted_lm_evaluation_resumes_system_by_system(files, capsys, scripted_cli, tmp_path, monkeypatch):
    import experiments.harness

    scripted_cli.answers = two_hop_script(final_answer="2017")
    args = ["evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
            "--retriever", "hyperprove,dense-iterative,dense", "--decomposition", "lm",
            "--embedder", "test-hash", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "results", "--no-track", "--json", "--bridge-rewrite", "lm", "--lm-adapter", "chat"]
    evaluate_program, evaluated = experiments.harness.evaluate_program, []

    def interrupted_at_dense(questions, program, **kw):
        if len(evaluated) == 2:
            raise KeyboardInterrupt
        evaluated.append(program)
        return evaluate_program(questions, program, **kw)

    monkeypatch.setattr(experiments.harness, "evaluate_program", interrupted_at_dense)
    code, _, err = run_scripted(capsys, scripted_cli, *args)
    assert code == 130 and "interrupted" in err
    assert not (tmp_path / "results").exists()
    partial = json.loads((tmp_path / "results.partial" / "results.json").read_text())
    assert partial["complete"] is False and list(partial["systems"]) == ["hyperprove", "dense-iterative"]

    # A different evaluation may not take over those results.
    code, _, err = run_scripted(capsys, scripted_cli, *args, "--alpha", "0.5")
    assert code == 2 and "results.partial: holds an interrupted run of another evaluation" in err

    # Settings added to the code since the interrupt count with the value the run went without
    # them, and where MLflow logs does not matter: recorded by older code, it still resumes.
    older = {**partial, "config": {**partial["config"], "tracking": {"uri": "sqlite:///elsewhere.db"},
                                   "program": {k: v for k, v in partial["config"]["program"].items() if k not in ("grounded_in", "bridge_rewrite")},
                                   "lm": {k: v for k, v in partial["config"]["lm"].items() if k != "adapter"}}}
    (tmp_path / "results.partial" / "results.json").write_text(json.dumps(older))
    evaluated.clear()
    monkeypatch.setattr(experiments.harness, "evaluate_program", lambda *a, **kw: evaluated.append(a[1]) or evaluate_program(*a, **kw))
    code, out, err = run_scripted(capsys, scripted_cli, *args)
    assert code == 0 and "resuming: hyperprove, dense-iterative finished earlier" in out
    assert len(evaluated) == 1 and scripted_cli.last.calls() == 1  # only dense ran: one reader call
    result = json.loads(out.strip().splitlines()[-1])
    assert result["retrievers"]["hyperprove"]["lm_calls_per_question"] == 5 and result["retrievers"]["dense"]["em"] == 100.0
    recorded = json.loads((tmp_path / "results" / "results.json").read_text())
    assert recorded["resumed"]["systems"] == ["hyperprove", "dense-iterative"] and "complete" not in recorded
    assert not (tmp_path / "results.partial").exists()


def test_evaluate_refuses_an_index_of_another_corpus(files, capsys, scripted_cli, tmp_path):
    code, _, _ = run_scripted(capsys, scripted_cli, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")
    assert code == 0
    (tmp_path / "other.json").write_text(json.dumps(CORPUS[:4]))
    code, _, err = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", tmp_path / "other.json",
                       "--index", files / "idx", "--retriever", "ppr", "--embedder", "test-hash", "--no-track")
    assert code == 2
    assert err == f"error: {files / 'idx'} (for {tmp_path / 'other.json'}): built from another corpus than the one evaluated (corpus checksums differ)\n"


def test_reproduce_reruns_a_tracked_run_and_refuses_changed_data(files, capsys, scripted_cli, tmp_path):
    scripted_cli.answers = two_hop_script(final_answer="Leah Adler")  # wrong on purpose: EM 0, F1 0
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code, out, _ = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "hyperprove,dense,ppr", "--decomposition", "lm", "--embedder", "test-hash",
                       "--cache-dir", tmp_path / "cache", "--out", tmp_path / "first", "--tracking-uri", uri, "--json")
    assert code == 0
    first = json.loads(out.strip().splitlines()[-1])
    code, out, _ = run_scripted(capsys, scripted_cli, "reproduce", first["mlflow_run"], "--tracking-uri", uri, "--out", tmp_path / "again",
                                "--cache-dir", tmp_path / "cache", "--json")
    assert code == 0
    again = json.loads(out.strip().splitlines()[-1])
    assert again["identical"] is True and again["reproduction"] != first["mlflow_run"]
    assert again["deltas"]["hyperprove"] == {"n": 0.0, "em": 0.0, "f1": 0.0, "recall@2": 0.0, "recall@5": 0.0,
                                             "lm_calls_per_question": 0.0, "errors": 0.0, "questions_with_fallbacks": 0.0}
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracking_uri=uri).get_run(again["reproduction"]).data.tags["hyperprove.reproduces"] == first["mlflow_run"]

    # A different answer would show as a delta; changed data is refused before anything runs.
    changed = [dict(p) for p in CORPUS]
    changed[4]["text"] += " It is long."
    (files / "corpus.json").write_text(json.dumps(changed))
    code, _, err = run_scripted(capsys, scripted_cli, "reproduce", first["mlflow_run"], "--tracking-uri", uri)
    assert code == 2
    assert err == f"error: {files / 'corpus.json'}: differs from the corpus run {first['mlflow_run']} was evaluated on (sha256 mismatch); not reproducing\n"
    code, _, err = run_scripted(capsys, scripted_cli, "reproduce", "0" * 32, "--tracking-uri", uri)
    assert code == 2 and err == f"error: run {'0' * 32}: not in the tracking store {uri}\n"




def test_compile_rejects_missing_files_and_questions_without_gold_decompositions(files, capsys, tmp_path):
    code, _, err = run(capsys, "compile", "--corpus", files / "corpus.json")
    assert code == 2 and err == "error: compile: give --questions and --corpus (or a --config with compile.questions and compile.corpus)\n"
    (tmp_path / "plain.json").write_text(json.dumps([{**QUESTIONS[0], "decomposition": []}]))
    code, _, err = run(capsys, "compile", "--questions", tmp_path / "plain.json", "--corpus", files / "corpus.json", "--target", "rewrite")
    assert code == 2 and err == f"error: {tmp_path / 'plain.json'}: --target rewrite needs gold decompositions (MuSiQue's or 2Wiki's); none found\n"


def test_compile_decompose_then_evaluate_and_reproduce_with_the_compiled_program(files, capsys, scripted_cli, tmp_path):
    (files / "train.json").write_text(json.dumps(TRAIN))
    scripted_cli.answers = {
        # t1: the gold decomposition (grade 1, bootstrapped); t2: one hop for three (grade < 0.6, rejected)
        TRAIN[0]["question"]: {"sub_questions": ["Who directed Jaws?", "Who was the mother of #1?"]},
        TRAIN[1]["question"]: {"sub_questions": [TRAIN[1]["question"]]},
        # v1 (validation, and the evaluated question): "is" for "was" in step 2, grade (1 + 0.8 + 1) / 3
        QUESTIONS[0]["question"]: {"sub_questions": ["Who directed Jaws?", "Who is the mother of #1?", "When did #2 die?"]},
    }
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    program = tmp_path / "decompose.json"
    code, out, _ = run_scripted(capsys, scripted_cli, "compile", "--questions", files / "train.json", "--corpus", files / "corpus.json", "--train", 2, "--val", 1,
                       "--demos", 1, "--labeled-demos", 1, "--out", program, "--tracking-uri", uri, "--cache-dir", tmp_path / "cache", "--json")
    assert code == 0
    report = json.loads(out.strip().splitlines()[-1])
    assert (report["train_examples"], report["val_examples"], report["val_before"], report["val_after"]) == (2, 1, 93.33, 93.33)
    assert report["val_selects"] is False  # BootstrapFewShot never sees the val examples
    assert report["demos"] == {"decompose.decompose": 2, "rewrite.rewrite": 2, "answer_hop.answer": 2, "generate.generate": 2,
                               "generate.choose": 2}
    record = json.loads((tmp_path / "decompose.record.json").read_text())
    assert record["program_sha256"] == hashlib.sha256(program.read_bytes()).hexdigest() and record["val_after"] == 93.33
    assert record["config"]["compile"]["target"] == "decompose"

    from pipeline.program import HyperProve

    loaded = HyperProve(None)
    loaded.load(str(program))
    bootstrapped, labeled = loaded.decompose.decompose.demos
    assert (bootstrapped["question"], bootstrapped["sub_questions"]) == (TRAIN[0]["question"], ["Who directed Jaws?", "Who was the mother of #1?"])
    assert (labeled["question"], labeled["sub_questions"]) == (TRAIN[1]["question"], [s["question"] for s in TRAIN[1]["decomposition"]])
    assert loaded.rewrite.rewrite.demos[0]["sub_question"] == "Who is the mother of #1?"  # the built-in ones stay

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    compiled_run = client.get_run(report["mlflow_run"])
    assert compiled_run.data.tags["hyperprove.kind"] == "compile" and compiled_run.data.params["compile.target"] == "decompose"
    assert compiled_run.data.metrics["val_after"] == 93.33
    assert {"decompose.json", "best_model.json", "trainset.json"} <= {a.path for a in client.list_artifacts(compiled_run.info.run_id)}

    # The compiled program drives evaluate (its demonstrations are in the decompose prompt), travels
    # with the run, and `reproduce` reruns with it.
    scripted_cli.answers = two_hop_script(final_answer="2017")
    code, out, _ = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--retriever", "hyperprove",
                       "--decomposition", "lm", "--program", program, "--embedder", "test-hash", "--cache-dir", tmp_path / "cache",
                       "--out", tmp_path / "first", "--tracking-uri", uri, "--json")
    assert code == 0
    first = json.loads(out.strip().splitlines()[-1])
    assert first["retrievers"]["hyperprove"]["em"] == 100.0 and first["retrievers"]["hyperprove"]["questions_with_fallbacks"] == 0
    (decompose_prompt,) = [str(call["messages"]) for call in scripted_cli.last.session.lm.history if "sub_questions ## ]]`" in str(call["messages"])]
    assert TRAIN[0]["question"] in decompose_prompt and TRAIN[1]["question"] in decompose_prompt and "Spielberg Prize" not in decompose_prompt
    results = json.loads((tmp_path / "first" / "results.json").read_text())
    assert results["program_sha256"] == hashlib.sha256(program.read_bytes()).hexdigest()
    assert results["config"]["program"]["compiled"] == str(program)
    assert {"program.json", "pages"} <= {a.path for a in client.list_artifacts(first["mlflow_run"])}
    # its one question is one trace, linked to the run and tagged with what the UI filters failures by
    (trace,) = client.search_traces(locations=[client.get_run(first["mlflow_run"]).info.experiment_id], run_id=first["mlflow_run"])
    tags = trace.info.tags
    assert first["traces"] == 1 and (tags["hyperprove.system"], tags["question_id"], tags["em"], tags["gold_answer"]) == ("hyperprove", "q1", "1.0", "2017")
    assert tags["gold_passages"] == "[0, 1, 2]" and tags["gold_reached"] in ("True", "False")
    assert {a.path for a in client.list_artifacts(first["mlflow_run"], "pages/hyperprove")} == {"pages/hyperprove/index.html", "pages/hyperprove/q1.html"}
    from experiments.runs.report import compiled_program

    assert compiled_program(results)[0].startswith(f"Program: `{program}`, compiled by `hyperprove compile` (decompose with bootstrap, "
                                                   "2 training examples, ")
    assert compiled_program(results)[0].endswith("its grade on 1 held-out training examples went from 93.33 to 93.33.")
    program.unlink()  # reproduce uses the program the run logged
    code, out, _ = run_scripted(capsys, scripted_cli, "reproduce", first["mlflow_run"], "--tracking-uri", uri, "--out", tmp_path / "again",
                                "--cache-dir", tmp_path / "cache", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["identical"] is True

    # Untracked, a compile still writes the program and its record, and logs nothing.
    code, out, _ = run_scripted(capsys, scripted_cli, "compile", "--questions", files / "train.json", "--corpus", files / "corpus.json", "--train", 2, "--val", 0,
                       "--out", tmp_path / "untracked.json", "--no-track", "--cache-dir", tmp_path / "cache", "--json")
    assert code == 0 and "mlflow_run" not in json.loads(out.strip().splitlines()[-1])
    assert json.loads((tmp_path / "untracked.record.json").read_text())["val_before"] is None
    assert len(client.search_runs([compiled_run.info.experiment_id], "tags.`hyperprove.kind` = 'compile'")) == 1


def test_compile_flags_override_the_experiment_config():
    from pathlib import Path

    from pipeline.cli import build_config, build_parser

    shipped = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "musique-compile-mipro.json"
    args = build_parser().parse_args(["compile", "--config", str(shipped), "--optimizer", "gepa", "--budget", "7"])
    settings = build_config(args).compile
    assert (settings.optimizer, settings.budget, settings.train, settings.val) == ("gepa", 7, 20, 20)  # the rest from the file
    assert build_config(build_parser().parse_args(["compile", "--config", str(shipped)])).compile.budget == 4
    assert settings.keep_builtin is False
    assert build_config(build_parser().parse_args(["compile", "--config", str(shipped), "--keep-builtin-demos"])).compile.keep_builtin is True


def test_answer_path_flags_reach_the_program_config():
    from pathlib import Path

    from modules.errors import HyperProveError
    from pipeline.cli import build_config, build_parser
    from pipeline.config import LMConfig, ProgramConfig

    off = build_config(build_parser().parse_args(["ask", "idx", "q", "--reader-evidence", "passages-only", "--no-question-channel",
                                                   "--entity-retries", "0", "--no-grounded-hops", "--no-comparison-demos",
                                                   "--bridge-rewrite", "rule", "--grounded-in", "evidence", "--no-choose-options"])).program
    assert (off.reader_evidence, off.question_channel, off.entity_retries, off.grounded_hops) == ("passages-only", False, 0, False)
    assert (off.comparison_demos, off.bridge_rewrite, off.grounded_in, off.choose_options) == (False, "rule", "evidence", False)
    shipped = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "musique-train-facts.json"
    on = build_config(build_parser().parse_args(["evaluate", "--config", str(shipped), "--question-channel", "--grounded-hops"])).program
    assert (on.reader_evidence, on.question_channel, on.entity_retries, on.grounded_hops) == ("facts", True, 0, True)
    defaults = build_config(build_parser().parse_args(["ask", "idx", "q"])).program
    assert (defaults.reader_evidence, defaults.question_channel, defaults.entity_retries, defaults.grounded_hops) == ("facts", True, 2, True)
    assert (defaults.comparison_demos, defaults.bridge_rewrite, defaults.grounded_in, defaults.choose_options) == (True, "rule", "cited", True)
    with pytest.raises(HyperProveError, match="bridge_rewrite='llm' must be 'lm' or 'rule'"):
        ProgramConfig(bridge_rewrite="llm")
    assert build_config(build_parser().parse_args(["ask", "idx", "q", "--lm-adapter", "lean"])).lm.adapter == "lean"
    # unnamed, the adapter is the model's: lean-prefilled on the embedded model, chat on an API model (a begun reply is refused by some)
    assert build_config(build_parser().parse_args(["ask", "idx", "q"])).lm.layout == "lean-prefilled"
    assert build_config(build_parser().parse_args(["ask", "idx", "q", "--lm", "openai/gpt-4o-mini"])).lm.layout == "chat"
    assert build_config(build_parser().parse_args(["ask", "idx", "q", "--lm", "openai/gpt-4o-mini", "--lm-adapter", "prefilled"])).lm.layout == "prefilled"
    # a record made before the field existed ran DSPy's chat adapter
    from pipeline.config import HyperProveConfig

    assert HyperProveConfig.from_record({}).lm.layout == "chat" and HyperProveConfig.from_record({"lm": {"adapter": None}}).lm.layout == "lean-prefilled"
    with pytest.raises(HyperProveError, match="adapter='json' must be one of 'chat', 'lean', 'prefilled', 'lean-prefilled'"):
        LMConfig(adapter="json")


def test_index_add_and_delete_change_an_index_that_evaluate_checks_against_its_corpus(files, capsys, scripted_cli, tmp_path):
    (tmp_path / "first.json").write_text(json.dumps(CORPUS[:3]))
    (tmp_path / "rest.json").write_text(json.dumps(CORPUS[3:]))
    code, _, _ = run_scripted(capsys, scripted_cli, "index", tmp_path / "first.json", "--out", tmp_path / "idx", "--embedder", "test-hash")
    assert code == 0
    code, out, _ = run_scripted(capsys, scripted_cli, "index", "--add", tmp_path / "rest.json", "--into", tmp_path / "idx", "--embedder", "test-hash", "--json")
    assert code == 0 and f"{tmp_path / 'idx'}: generation 1, 2 passages added (3 -> 5)" in out
    assert json.loads(out.strip().splitlines()[-1])["passages"] == 5
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert [g["added"] for g in manifest["generations"]] == [3, 2]
    # run again (after a kill, or by mistake): what the index holds is not added twice
    code, out, _ = run_scripted(capsys, scripted_cli, "index", "--add", tmp_path / "rest.json", "--into", tmp_path / "idx", "--embedder", "test-hash",
                                "--json")
    assert code == 0 and "2 of the 2 passages are in the index already (or repeated): skipped" in out
    assert json.loads(out.strip().splitlines()[-1])["added"] == 0
    assert json.loads((tmp_path / "idx" / "manifest.json").read_text()) == manifest
    # the grown index is the index of the whole corpus: evaluate takes it for corpus.json
    code, out, err = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--index", tmp_path / "idx",
                         "--retriever", "hyperprove", "--embedder", "test-hash", "--no-track", "--out", tmp_path / "results", "--json")
    assert code == 0, err
    # delete the last passage by title: the corpus of generation 1 no longer fits the index, and evaluate says why
    (tmp_path / "gone.json").write_text(json.dumps([CORPUS[-1]["title"]]))
    code, out, _ = run_scripted(capsys, scripted_cli, "index", "--delete", tmp_path / "gone.json", "--into", tmp_path / "idx", "--embedder", "test-hash")
    assert code == 0 and f"{tmp_path / 'idx'}: generation 2, 1 passages removed (5 -> 4;" in out
    code, _, err = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--index", tmp_path / "idx",
                                "--retriever", "hyperprove", "--embedder", "test-hash", "--no-track", "--out", tmp_path / "results2")
    assert code == 2 and err == (f"error: {tmp_path / 'idx'} (for {files / 'corpus.json'}): the corpus evaluated is the one of its generation 1, but passages "
                                 "were added or deleted since (it is at generation 2); evaluate it with the corpus it holds now\n")
    # one line for the wrong combinations
    for wrong in (["--add", tmp_path / "rest.json"], ["--add", tmp_path / "rest.json", "--delete", tmp_path / "gone.json", "--into", tmp_path / "idx"]):
        code, _, err = run_scripted(capsys, scripted_cli, "index", *wrong, "--embedder", "test-hash")
        assert code == 2 and err == ("error: index --add NEW or --delete WHAT (one of them) takes --into DIR (the index to change), "
                                     "and no corpus or --out\n")
    code, _, err = run_scripted(capsys, scripted_cli, "index", files / "corpus.json", "--embedder", "test-hash")
    assert code == 2 and err == "error: index: give a corpus or a folder and --out DIR (or --add NEW / --delete WHAT --into DIR to change an index)\n"


def test_index_with_the_lm_entities_extractor_names_it_and_its_lm(files, capsys, scripted_cli):
    # every passage gets the list "Jaws", "Steven Spielberg": the two passages that name them keep it; the other three
    # support neither name, are asked again, and fall back to the sentences extractor
    scripted_cli.answers = {"": {"entities": ["Jaws", "Steven Spielberg"]}}
    code, out, _ = run_scripted(capsys, scripted_cli, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash",
                                "--extractor", "lm-entities", "--cache-dir", files / "cache")
    assert code == 0
    assert "lm-entities extraction: 5 passages, 0 from the cache, 2 extracted, 3 retried, 3 fell back to sentences (Leah Adler, " in out
    manifest = json.loads((files / "idx" / "manifest.json").read_text())
    assert (manifest["extractor"]["name"], manifest["extractor"]["version"]) == ("lm-entities", "1-sentences1")
    facts = [json.loads(line) for line in (files / "idx" / "facts.jsonl").read_text().splitlines()]
    names = json.loads((files / "idx" / "entities.json").read_text())
    assert facts[0]["text"] == CORPUS[0]["text"] and [names[e] for e in facts[0]["entities"]] == ["Jaws", "Steven Spielberg"]


def test_every_flag_names_the_default_of_the_config_field_it_sets():
    """The help's defaults come from the config, so they cannot drift from it."""
    from pipeline.cli import build_parser
    from pipeline.config import HyperProveConfig

    defaults = HyperProveConfig()
    commands = build_parser()._subparsers._group_actions[0].choices
    checked = 0
    for command in ("index", "ask", "evaluate", "sweep", "compile"):
        for action in commands[command]._actions:
            section, _, name = action.dest.rpartition(".")
            if section and action.help and "(default: " in action.help:
                value = getattr(getattr(defaults, section), name)
                shown = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
                if action.help.endswith(f"(default: {shown})"):
                    checked += 1
                else:  # a default worded by hand must be one the field cannot print as itself (None, or per model)
                    assert value is None or name in ("threads", "workers", "extractor", "retrievers", "keep_builtin"), (command, action.dest, action.help)
            assert "Undefined" not in (action.help or "")
    assert checked >= 60
    assert commands["evaluate"]._option_string_actions["--eta"].help.endswith("(default: 0.8)")


def test_evaluate_skips_the_first_questions(files, capsys, tmp_path):
    second = {**QUESTIONS[0], "id": "q2", "question": "Who directed Jaws?", "answer": "Steven Spielberg", "gold_passages": [0],
              "decomposition": [QUESTIONS[0]["decomposition"][0]]}
    (tmp_path / "two.json").write_text(json.dumps([QUESTIONS[0], second]))
    code, out, err = run(capsys, "evaluate", "--questions", tmp_path / "two.json", "--corpus", files / "corpus.json", "--retriever", "dense",
                         "--skip", 1, "--no-track", "--out", tmp_path / "skipped")
    assert code == 0, err
    predictions = json.loads((tmp_path / "skipped" / "predictions.json").read_text())["dense"]
    assert [row["id"] for row in predictions] == ["q2"]


def test_compile_steps_pools_gold_steps_that_evaluate_shows_by_similarity(files, capsys, scripted_cli, tmp_path):
    (files / "train.json").write_text(json.dumps(TRAIN))
    program = tmp_path / "steps.json"
    code, out, _ = run_scripted(capsys, scripted_cli, "compile", "--questions", files / "train.json", "--corpus", files / "corpus.json",
                                "--target", "steps", "--optimizer", "similar", "--labeled-demos", 2, "--train", 100, "--out", program,
                                "--embedder", "test-hash", "--cache-dir", tmp_path / "cache", "--no-track", "--json")
    assert code == 0
    report = json.loads(out.strip().splitlines()[-1])
    # 3 decompositions; the 8 gold steps each have their answer in a sentence of their gold passage, which
    # every step's evidence holds (the tiny passages are one or two sentences)
    assert (report["pooled"], report["per_call"], report["lm_calls"]) == ({"decompose.decompose": 3, "answer_hop.answer": 8}, 2, 0)
    assert not (tmp_path / "steps.lm_calls.jsonl.gz").exists()
    state = json.loads(program.read_text())
    mother = next(example for example in state["answer_hop.answer"]["pool"] if example["question"] == "Who was the mother of Steven Spielberg?")
    supporting = [mother["evidence"][n - 1] for n in mother["supporting"]]
    assert mother["answer"] == "Leah Adler" and supporting == [line for line in mother["evidence"] if "(Steven Spielberg) Steven Spielberg's mother was Leah Adler." in line]
    assert state["decompose.decompose"]["demos"] == []  # the pool replaces the built-in demonstrations

    scripted_cli.answers = two_hop_script(final_answer="2017")
    code, out, _ = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                                "--retriever", "hyperprove", "--decomposition", "lm", "--program", program, "--embedder", "test-hash",
                                "--cache-dir", tmp_path / "cache", "--out", tmp_path / "run", "--no-track", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["retrievers"]["hyperprove"]["em"] == 100.0
    (decompose_prompt,) = [str(call["messages"]) for call in scripted_cli.last.session.lm.history if "sub_questions ## ]]`" in str(call["messages"])]
    # the two other training questions are shown; the one that is the asked question is not, nor a built-in demonstration
    assert TRAIN[0]["question"] in decompose_prompt and TRAIN[1]["question"] in decompose_prompt
    assert "When did #2 die?" not in decompose_prompt and "Spielberg Prize" not in decompose_prompt

    for choose in ("question", "once"):
        code, out, _ = run_scripted(capsys, scripted_cli, "compile", "--questions", files / "train.json", "--corpus", files / "corpus.json",
                                    "--target", "steps", "--optimizer", "similar", "--choose", choose, "--labeled-demos", 2, "--out", program,
                                    "--embedder", "test-hash", "--cache-dir", tmp_path / "cache", "--no-track")
        state = json.loads(program.read_text())
        if choose == "question":  # the hop examples know their question; the decomposer's calls are one a question already
            assert "shown, the same on each of its calls" in out
            assert state["answer_hop.answer"]["by"] == "question" and "by" not in state["decompose.decompose"]
            assert {example["asked"] for example in state["answer_hop.answer"]["pool"]} == {q["question"] for q in TRAIN}
        else:  # two fixed demonstrations each, no pool
            assert "2 representatives shown to every call" in out
            assert [len(state[name]["demos"]) for name in ("decompose.decompose", "answer_hop.answer")] == [2, 2]
            assert "pool" not in state["decompose.decompose"] and "pool" not in state["answer_hop.answer"]


def test_compile_program_pools_the_calls_of_the_questions_answered_right_with_every_hop_checked(files, capsys, scripted_cli, tmp_path):
    # t1 and t2 answered right; v1 answered wrong; t3 answered right, but its gold passage does not hold hop 2's answer
    unchecked = {"id": "t3", "question": "Which restaurateur was the mother of the director of Jaws?", "answer": "Leah Adler", "gold_passages": [0]}
    (files / "train.json").write_text(json.dumps([*TRAIN, unchecked]))
    scripted_cli.answers = {**two_hop_script(final_answer="1999"), f"[[ ## question ## ]]\n{TRAIN[0]['question']}": {"answer": "Leah Adler"},
                            f"[[ ## question ## ]]\n{TRAIN[1]['question']}": {"answer": "Los Angeles"},
                            f"[[ ## question ## ]]\n{unchecked['question']}": {"answer": "Leah Adler"}}
    program = tmp_path / "traced.json"
    code, out, _ = run_scripted(capsys, scripted_cli, "compile", "--questions", files / "train.json", "--corpus", files / "corpus.json",
                                "--target", "program", "--optimizer", "similar", "--choose", "question", "--labeled-demos", 2, "--out", program,
                                "--embedder", "test-hash", "--cache-dir", tmp_path / "cache", "--no-track", "--json")
    assert code == 0
    report = json.loads(out.strip().splitlines()[-1])
    # 4 questions, each one decomposition, two hops and the final reader: 16 calls; t1's and t2's are pooled
    assert report["traced"] == {"questions": 4, "counted": 2, "threshold": 0.5} and report["lm_calls"] == 16
    assert report["pooled"] == {"decompose.decompose": 2, "answer_hop.answer": 4, "generate.generate": 2}
    state = json.loads(program.read_text())
    assert [(e["asked"], e["sub_questions"]) for e in state["decompose.decompose"]["pool"]] == [
        (TRAIN[0]["question"], ["Who directed Jaws?", "Who was the mother of #1?"]), (TRAIN[1]["question"], ["Who directed Jaws?", "Who was the mother of #1?"])]
    hops = state["answer_hop.answer"]["pool"]
    assert [(e["question"], e["answer"], e["supporting"]) for e in hops[:2]] == [
        ("Who directed Jaws?", "Steven Spielberg", [1]), ("Who was the mother of Steven Spielberg?", "Leah Adler", [1])]
    assert any("Steven Spielberg's mother was Leah Adler." in line for line in hops[1]["evidence"])
    assert [(e["asked"], e["answer"]) for e in state["generate.generate"]["pool"]] == [(TRAIN[0]["question"], "Leah Adler"), (TRAIN[1]["question"], "Los Angeles")]
    assert state["answer_hop.answer"]["by"] == "question" and state["generate.generate"]["demos"] == []
    assert "traced: 2 of 4 questions answered right" in out

    # evaluated on a new question, every call is shown the calls of the two pooled questions, and no built-in demonstration
    scripted_cli.answers = two_hop_script(final_answer="2017")
    asked = {**QUESTIONS[0], "question": "When did the mother of the man who directed Jaws die?"}
    scripted_cli.answers[f"[[ ## question ## ]]\n{asked['question']}"] = scripted_cli.answers.pop(f"[[ ## question ## ]]\n{QUESTIONS[0]['question']}")
    (files / "asked.json").write_text(json.dumps([asked]))
    code, out, _ = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "asked.json", "--corpus", files / "corpus.json",
                                "--retriever", "hyperprove", "--decomposition", "lm", "--program", program, "--embedder", "test-hash",
                                "--cache-dir", tmp_path / "cache", "--out", tmp_path / "run", "--no-track", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["retrievers"]["hyperprove"]["em"] == 100.0
    calls = scripted_cli.last.session.lm.history
    shown = [[m["content"].splitlines()[1] for m in call["messages"] if m["role"] == "user"][:-1] for call in calls]
    # decomposer and final reader: both pooled questions, the nearest (t1) last; each hop: the two hops of t1, in order
    assert shown == [[TRAIN[1]["question"], TRAIN[0]["question"]], ["Who directed Jaws?", "Who was the mother of Steven Spielberg?"],
                     ["Who directed Jaws?", "Who was the mother of Steven Spielberg?"], [TRAIN[1]["question"], TRAIN[0]["question"]]]
    assert calls[3]["messages"][2]["content"] == "[[ ## answer ## ]]\nLos Angeles\n\n[[ ## completed ## ]]\n"  # t2's answer shown


def test_compile_final_pools_gold_passages_that_every_reader_is_shown_by_similarity(files, capsys, scripted_cli, tmp_path):
    both = {"id": "h1", "question": "Were Steven Spielberg and Leah Adler both American?", "answer": "yes", "gold_passages": [1, 2]}
    unsupported = {"id": "h2", "question": "Which river flows past Cincinnati?", "answer": "the Hudson", "gold_passages": [3]}
    (files / "train.json").write_text(json.dumps([*TRAIN, both, unsupported]))
    program = tmp_path / "final.json"
    code, out, _ = run_scripted(capsys, scripted_cli, "compile", "--questions", files / "train.json", "--corpus", files / "corpus.json",
                                "--target", "final", "--optimizer", "similar", "--labeled-demos", 2, "--out", program,
                                "--embedder", "test-hash", "--cache-dir", tmp_path / "cache", "--no-track", "--json")
    assert code == 0
    # three MuSiQue-style questions and the yes/no one without a decomposition; no shown fact names the Hudson
    assert json.loads(out.strip().splitlines()[-1])["pooled"] == {"generate.generate": 4}
    pool = json.loads(program.read_text())["generate.generate"]["pool"]
    mother, *_, yes = pool
    # two gold passages: up to 5 // 2 = 2 facts of each, in their own order, after the gold steps answered
    assert mother["evidence"] == ["Who directed Jaws? -> Steven Spielberg", "Who was the mother of Steven Spielberg? -> Leah Adler",
                                  "(Jaws (film)) Jaws is a 1975 thriller film directed by Steven Spielberg.",
                                  "(Steven Spielberg) Steven Spielberg is an American film director.",
                                  "(Steven Spielberg) Steven Spielberg's mother was Leah Adler."]
    assert (yes["answer"], yes["asked"], len(yes["evidence"])) == ("yes", both["question"], 4)
    assert not any(line.startswith("Were") or "->" in line for line in yes["evidence"])
    # three gold passages: one fact each; the one that holds the answer comes first
    assert pool[1]["evidence"][-1].startswith("(Leah Adler)") and "Los Angeles" in pool[1]["evidence"][-1]

    scripted_cli.answers = {f"[[ ## question ## ]]\n{QUESTIONS[0]['question']}": {"answer": "2017"}}
    code, out, _ = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                                "--retriever", "bm25", "--decomposition", "lm", "--program", program, "--embedder", "test-hash",
                                "--cache-dir", tmp_path / "cache", "--out", tmp_path / "run", "--no-track", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["retrievers"]["bm25"]["em"] == 100.0
    (prompt,) = [str(call["messages"]) for call in scripted_cli.last.session.lm.history]
    # a peer's reader is shown the two training questions nearest the asked one (bag of words), not the asked one
    # itself (the third), not the yes/no one, and no built-in demonstration
    assert TRAIN[0]["question"] in prompt and TRAIN[1]["question"].replace("'", "\\'") in prompt
    assert both["question"] not in prompt and "restaurant owned by" not in prompt
    assert str(prompt).count(QUESTIONS[0]["question"]) == 1
    scripted_cli.answers = two_hop_script(final_answer="2017")  # and so is the program's
    code, out, _ = run_scripted(capsys, scripted_cli, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                                "--retriever", "hyperprove", "--decomposition", "lm", "--program", program, "--embedder", "test-hash",
                                "--cache-dir", tmp_path / "cache", "--out", tmp_path / "program", "--no-track", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["retrievers"]["hyperprove"]["em"] == 100.0
    prompts = [str(call["messages"]) for call in scripted_cli.last.session.lm.history]
    assert [TRAIN[0]["question"] in prompt for prompt in prompts] == [False, False, False, True]  # decompose, two hops, the final reader
