"""The generated report: run order, the verdict line, and the rendered sections."""

import json

from experiments.runs.report import main, paired_table, render_same_reader, verdict
from experiments.runs.results import load_runs


def test_verdict_compares_hyperprove_with_the_best_peer():
    systems = {"dense": {"recall@5": 57.78}, "ppr": {"recall@5": 59.72}, "hyperprove": {"recall@5": 79.58}}
    assert verdict({"systems": systems}) == ["Recall@5: hyperprove 79.58 against the best peer, ppr 59.72: +19.86 (+33.3% relative)."]
    fixed = {"ppr": {"recall@5": 89.17}, "hyperprove-fixed": {"recall@5": 83.33}}
    assert verdict({"systems": fixed}) == ["Recall@5: hyperprove-fixed 83.33 against the best peer, ppr 89.17: -5.84 (-6.5% relative)."]
    assert verdict({"systems": {"dense": {"recall@5": 1.0}}}) == []


def test_verdict_names_the_paired_interval_and_compares_f1_under_the_same_reader(tmp_path):
    # ten questions; per-question F1 (0-1): hyperprove answers nine that ppr misses; its passages read alone match ppr
    rows = {"hyperprove": [1.0] * 9 + [0.5], "hyperprove-passages": [0.0] * 9 + [0.5], "ppr": [0.0] * 9 + [0.5], "dense": [0.0] * 10}
    (tmp_path / "predictions.json").write_text(json.dumps(
        {name: [{"id": f"q{k}", "f1": f1, "recall@5": 1.0} for k, f1 in enumerate(values)] for name, values in rows.items()}))
    systems = {name: {"f1": 10 * sum(values), "recall@5": 100.0} for name, values in rows.items()}
    lines = verdict({"systems": systems, "results_dir": str(tmp_path)})
    assert lines[0] == ("Recall@5: hyperprove 100.00 against the best peer, ppr 100.00: +0.00 (+0.0% relative); paired bootstrap "
                        "95% interval +0.00 to +0.00 (up on 0 questions, down on 0, level on 10), so not told apart.")
    # hyperprove minus ppr: +100 on nine questions, 0 on one. A resample's mean is 100 (10 - K) / 10, K ~ Binomial(10, 0.1)
    # the draws of the level question: P(K >= 4) = 1.3% and P(K >= 3) = 7.0%, so the 2.5th percentile is K = 3: +70;
    # P(K = 0) = 35%, so the 97.5th is +100.
    assert lines[1] == ("F1: hyperprove 95.00 against the best peer, ppr 5.00: +90.00 (+1800.0% relative); paired bootstrap 95% interval "
                        "+70.00 to +100.00 (up on 9 questions, down on 0, level on 1), so ahead.")
    assert lines[2] == ("F1: hyperprove-passages 5.00 against the best peer, ppr 5.00: +0.00 (+0.0% relative); paired bootstrap "
                        "95% interval +0.00 to +0.00 (up on 0 questions, down on 0, level on 10), so not told apart.")
    # every system against hyperprove; against dense the differences are 100 on nine questions and 50 on one: a
    # resample's mean is 100 - 5K with the same K, so the interval is +85 (K = 3) to +100 (K = 0)
    assert paired_table({"systems": systems, "results_dir": str(tmp_path)})[2:] == [
        "| hyperprove minus | F1 | R@5 |", "|---|---:|---:|",
        "| hyperprove-passages | +90.00 [+70.00, +100.00] | +0.00 [+0.00, +0.00] |",
        "| ppr | +90.00 [+70.00, +100.00] | +0.00 [+0.00, +0.00] |",
        "| dense | +95.00 [+85.00, +100.00] | +0.00 [+0.00, +0.00] |", ""]


def test_report_orders_runs_and_renders_each(tmp_path):
    def write(name, decomposition):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({
            "name": name, "decomposition": decomposition, "n_questions": 60, "git_commit": "0123456789abcdef", "git_dirty": "false",
            "mlflow_run": "abc", "systems": {"dense": {"system": "dense", "n": 60, "recall@2": 40.0, "recall@5": 50.0},
                                             "hyperprove": {"system": "hyperprove", "n": 60, "recall@2": 45.0, "recall@5": 55.0}},
        }))

    write("musique-lm60", "lm")
    write("hotpotqa-retrieval", "gold")
    write("musique-retrieval", "gold")
    write("2wiki-lm60.partial", "lm")  # an interrupted run is no result yet
    assert [run["name"] for run in load_runs(tmp_path)] == ["musique-retrieval", "hotpotqa-retrieval", "musique-lm60"]
    assert main(["--results", str(tmp_path), "--out", str(tmp_path / "REPORT.md")]) == 0
    report = (tmp_path / "REPORT.md").read_text()
    assert report.index("## musique-retrieval") < report.index("## hotpotqa-retrieval") < report.index("## musique-lm60")
    assert "command: `hyperprove evaluate --config experiments/configs/musique-lm60.json`; 60 questions; commit 0123456789; MLflow run `abc`." in report
    assert "| hyperprove | 60 | 45.00 | 55.00 |\n" in report  # no column that no system has
    # once in each run's section, and once more in the same-reader summary, which holds musique-lm60 only
    assert report.count("Recall@5: hyperprove 55.00 against the best peer, dense 50.00: +5.00 (+10.0% relative).") == 4
    assert report.index("## Every system through the same reader") < report.index("## musique-retrieval")
    assert "- musique-lm60: Recall@5: hyperprove 55.00 against the best peer, dense 50.00: +5.00 (+10.0% relative).\n" in report


def test_the_same_reader_runs_make_one_table_of_every_system():
    def run(name, systems):
        return {"name": name, "n_questions": 60, "systems": systems}

    runs = [
        run("hotpotqa-lm60", {"hyperprove": {"em": 35.0, "f1": 39.78, "recall@5": 85.0}, "ppr": {"em": 23.33, "f1": 27.5, "recall@5": 89.17}}),
        run("musique-retrieval", {"dense": {"recall@5": 57.78}}),  # no reader: not a same-reader run
        run("musique-lm60", {"hyperprove": {"em": 6.67, "f1": 13.31, "recall@5": 63.06}, "dense": {"em": 6.67, "f1": 9.17, "recall@5": 57.78}}),
    ]
    lines = render_same_reader(runs)
    # the runs in dataset order, every system of any run a row, "–" where a run lacks the system
    assert lines[4:9] == ["| system | musique-lm60 (60) | hotpotqa-lm60 (60) |", "|---|---:|---:|",
                          "| hyperprove | 6.67 / 13.31 / 63.06 | 35.00 / 39.78 / 85.00 |",
                          "| dense | 6.67 / 9.17 / 57.78 | – |",
                          "| ppr | – | 23.33 / 27.50 / 89.17 |"]
    # each run's F1 and Recall@5 verdicts (no predictions here, so no interval): 13.31 - 9.17 = 4.14, 4.14 / 9.17 = 45.1%
    assert lines[10:] == ["- musique-lm60: Recall@5: hyperprove 63.06 against the best peer, dense 57.78: +5.28 (+9.1% relative).",
                          "- musique-lm60: F1: hyperprove 13.31 against the best peer, dense 9.17: +4.14 (+45.1% relative).",
                          "- hotpotqa-lm60: Recall@5: hyperprove 85.00 against the best peer, ppr 89.17: -4.17 (-4.7% relative).",
                          "- hotpotqa-lm60: F1: hyperprove 39.78 against the best peer, ppr 27.50: +12.28 (+44.7% relative).", ""]
    assert render_same_reader(runs[1:2]) == []


def test_a_sweep_is_rendered_with_its_held_out_check(tmp_path):
    from experiments.runs.report import render_sweep

    sweep = {
        "study": "s", "objective": "recall@5", "tie_break": "recall@2", "complete": 29, "pruned": 1, "n_questions": 40,
        "questions": "train.json", "best_trial": 7, "git_commit": "0123456789abcdef", "mlflow_run": "xyz",
        "config": {"evaluation": {"name": "musique-sweep", "description": "A sweep."}},
        "start_params": {"alpha": 0.9, "theta": 0.05, "depth": 2, "top_k": 3},
        "best_params": {"alpha": 0.8512, "theta": 0.0, "depth": 1, "top_k": 4},
        "start_scores": {"recall@5": 84.79, "recall@2": 65.21}, "best_scores": {"recall@5": 85.42, "recall@2": 63.0},
        "validation": {"questions": "dev.json", "n_questions": 60, "start_scores": {"recall@5": 79.58, "recall@2": 60.83},
                       "best_scores": {"recall@5": 80.0, "recall@2": 61.25}},
    }
    lines = render_sweep(sweep, ["results/musique-sweep/history.png"])
    assert lines[4] == ("command: `hyperprove sweep --config experiments/configs/musique-sweep.json`; 29 complete and 1 pruned trials "
                        "on 40 questions of `train.json`; held out: 60 questions of `dev.json`; commit 0123456789; MLflow run `xyz`.")
    assert "| configured (trial 0) | 0.900 | 0.050 | 2 | 3 | 84.79 | 65.21 | 79.58 | 60.83 |" in lines
    assert "| best (trial 7) | 0.851 | 0.000 | 1 | 4 | 85.42 | 63.00 | 80.00 | 61.25 |" in lines
    assert "Held out, the best parameters' recall@5 80.00 is above the configured parameters' 79.58 (+0.42)." in lines
    # with the paired differences a sweep now records
    difference = {"metric": "recall@5", "mean": 0.42, "interval95": [-0.42, 1.25], "up": 2, "down": 1, "same": 57, "verdict": "within noise"}
    lines = render_sweep({**sweep, "difference": {**difference, "mean": 0.63, "interval95": [0.0, 1.88], "down": 0, "same": 38},
                          "validation": {**sweep["validation"], "difference": difference}}, ["results/musique-sweep/history.png"])
    assert ("Best minus configured, question by question, where the sweep ran: recall@5 +0.63 (95% interval +0.00 to +1.88; "
            "2 up, 0 down, 38 same): within noise.") in lines
    assert ("Held out, the best parameters' recall@5 80.00 is above the configured parameters' 79.58 (+0.42); question by question: "
            "recall@5 +0.42 (95% interval -0.42 to +1.25; 2 up, 1 down, 57 same): within noise.") in lines
    assert "Plots: [history](results/musique-sweep/history.png)." in lines
    # a transfer check on another corpus gets its own columns and line
    transfer = {"questions": "other/dev.json", "n_questions": 50, "start_scores": {"recall@5": 70.0, "recall@2": 50.0},
                "best_scores": {"recall@5": 69.5, "recall@2": 50.5}}
    lines = render_sweep({**sweep, "transfer": transfer})
    assert lines[4].endswith("held out: 60 questions of `dev.json`; transfer: 50 questions of `other/dev.json`; commit 0123456789; MLflow run `xyz`.")
    assert "| configured (trial 0) | 0.900 | 0.050 | 2 | 3 | 84.79 | 65.21 | 79.58 | 60.83 | 70.00 | 50.00 |" in lines
    assert "On `other/dev.json` (another corpus), the best parameters' recall@5 69.50 is below the configured parameters' 70.00 (-0.50)." in lines


def test_a_compiled_run_is_compared_with_the_same_setting_uncompiled():
    from experiments.runs.report import compiled_program

    setting = {"evaluation": {"questions": "q.json", "corpus": "c.json", "limit": 60, "decomposition": "lm"},
               "retriever": {"alpha": 0.9}, "index": {"extractor": "sentences"}}
    base = {"name": "base", "config": {**setting, "program": {"compiled": None}},
            "systems": {"hyperprove": {"recall@2": 45.56, "recall@5": 65.97, "em": 8.33, "f1": 14.14}}}
    other = {"name": "other", "config": {**setting, "retriever": {"alpha": 0.5}, "program": {"compiled": None}}, "systems": {}}
    compiled = {"name": "compiled", "config": {**setting, "program": {"compiled": "/nowhere/p.json"}},
                "systems": {"hyperprove": {"recall@2": 48.06, "recall@5": 60.42, "em": 10.0, "f1": 15.1}}}
    assert compiled_program(compiled, [other, base, compiled]) == [
        "Program: `/nowhere/p.json` (no compile record beside it).", "",
        "Against `base` (the same setting, built-in demonstrations), hyperprove: R@2 +2.50, R@5 -5.55, EM +1.67, F1 +0.96.", ""]
    assert compiled_program(base, [base, compiled]) == []
    # a base run with another answer path (here the checks on) is not the same setting: no comparison
    checked = {**base, "name": "checked", "config": {**setting, "program": {"compiled": None, "entity_retries": 2}}}
    assert compiled_program(compiled, [checked, compiled]) == ["Program: `/nowhere/p.json` (no compile record beside it).", ""]
    # a base recorded before the sentence rules and with a retired option off ran the same setting as a compiled
    # run that names rules 1 and no retired option; rules 2 or the retired option on is another setting
    older = {**base, "name": "older", "config": {**setting, "program": {"compiled": None, "option_hops": False}}}
    pinned = {**compiled, "config": {**setting, "index": {"extractor": "sentences", "sentence_rules": 1}, "program": {"compiled": "/nowhere/p.json"}}}
    assert compiled_program(pinned, [older, pinned])[2].startswith("Against `older` (the same setting, built-in demonstrations)")
    rules2 = {**pinned, "config": {**pinned["config"], "index": {"extractor": "sentences", "sentence_rules": 2}}}
    retired_on = {**older, "config": {**older["config"], "program": {"compiled": None, "option_hops": True}}}
    assert len(compiled_program(rules2, [older, rules2])) == len(compiled_program(pinned, [retired_on, pinned])) == 2
    # a base recorded before the lexical search existed ran without it: the same setting as a run that names it off
    off = {**compiled, "config": {**setting, "retriever": {"alpha": 0.9, "lexical_seeds": 0, "lexical_weight": 0.0},
                                  "program": {"compiled": "/nowhere/p.json"}}}
    on = {**off, "config": {**off["config"], "retriever": {"alpha": 0.9, "lexical_seeds": 10, "lexical_weight": 0.3}}}
    assert compiled_program(off, [base, off])[2].startswith("Against `base` (the same setting, built-in demonstrations)")
    assert len(compiled_program(on, [base, on])) == 2


def test_the_compile_record_says_whether_the_grade_was_held_out(tmp_path):
    import json

    from experiments.runs.report import compiled_program

    program = tmp_path / "p.json"
    record = {"target": "decompose", "optimizer": "mipro", "train_examples": 20, "val_examples": 20, "val_before": 37.55,
              "val_after": 48.35, "lm_calls": 300, "git_commit": "0123456789abcdef", "program_sha256": "abc"}
    run = {"name": "compiled", "program_sha256": "abc", "config": {"program": {"compiled": str(program)}}, "systems": {}}
    for selects, words in ((True, "training examples it also chose on"), (False, "held-out training examples")):
        (tmp_path / "p.record.json").write_text(json.dumps({**record, "val_selects": selects}))
        assert compiled_program(run, [run])[0] == (
            f"Program: `{program}`, compiled by `hyperprove compile` (decompose with mipro, 20 training examples, 300 LM calls, "
            f"commit 0123456789); its grade on 20 {words} went from 37.55 to 48.35.")
    # a pool of examples: gold steps, or the program's own calls on the training questions it answered right
    pool = {"target": "steps", "optimizer": "similar", "pooled": {"answer_hop.answer": 5}, "per_call": 3, "choose": "question",
            "lm_calls": 0, "git_commit": "0123456789abcdef", "program_sha256": "abc"}
    for extra, source in (({}, "of gold steps"), ({"target": "program", "traced": {"questions": 9, "counted": 4, "threshold": 0.5}},
                                                  "from the program's own calls on the 4 of 9 training questions it answered right")):
        (tmp_path / "p.record.json").write_text(json.dumps({**pool, **extra}))
        assert f"with similar, 5 answer_hop.answer examples {source}, the 3 nearest" in compiled_program(run, [run])[0]


def test_a_compiled_run_is_compared_question_by_question_when_predictions_are_there(tmp_path):
    import json

    from experiments.runs.report import compiled_program

    setting = {"evaluation": {"questions": "q.json", "corpus": "c.json", "limit": 2, "decomposition": "lm"}}
    runs = []
    for name, program, rows in (("base", None, [("a", 0.5, 0.0), ("b", 1.0, 1.0)]), ("compiled", "/nowhere/p.json", [("b", 1.0, 0.5), ("a", 1.0, 0.0)])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "predictions.json").write_text(json.dumps(
            {"hyperprove": [{"id": i, "recall@5": r5, "f1": f1} for i, r5, f1 in rows]}))
        runs.append({"name": name, "results_dir": str(tmp_path / name), "config": {**setting, "program": {"compiled": program}},
                     "systems": {"hyperprove": {"recall@5": 100 * sum(r[1] for r in rows) / 2, "f1": 100 * sum(r[2] for r in rows) / 2}}})
    lines = compiled_program(runs[1], runs)
    # matched by question id: recall@5 differences +50 (a) and 0 (b); f1 differences 0 (a) and -50 (b). A resample of two is
    # both picks the same question with chance 1/2, so the intervals reach both ends.
    assert lines[4] == ("Question by question: recall@5 +25.00 (95% interval +0.00 to +50.00; 1 up, 0 down, 1 same): within noise; "
                        "f1 -25.00 (95% interval -50.00 to +0.00; 0 up, 1 down, 1 same): within noise.")


def test_train_runs_become_one_table_of_answer_paths_per_dataset(tmp_path):
    from experiments.runs.report import render_choices

    def write(name, program, rows, finished):
        (tmp_path / name).mkdir()
        (tmp_path / name / "predictions.json").write_text(json.dumps(
            {system: [{"id": f"q{k}", "f1": f1} for k, f1 in enumerate(values)] for system, values in rows.items()}))
        systems = {system: {"n": 2, "em": 50.0 * sum(v == 1.0 for v in values), "f1": 50.0 * sum(values), "recall@5": 75.0,
                            "lm_calls_per_question": 5.0 if system == "hyperprove" else 1.0} for system, values in rows.items()}
        return {"name": name, "results_dir": str(tmp_path / name), "config": {"program": program}, "systems": systems,
                "git_commit": "0123456789abcdef", "finished": finished}

    runs = [
        write("musique-train-passages-qc", {"reader_evidence": "passages", "question_channel": True},
              {"hyperprove": [1.0, 1.0], "hyperprove-passages": [1.0, 0.0]}, "2026-12-01 07:00 UTC"),
        write("musique-train-facts", {"reader_evidence": "facts"}, {"hyperprove": [0.0, 1.0]}, "2026-12-01 06:00 UTC"),
    ]
    lines = render_choices(runs)
    table = lines[lines.index("### musique train") + 2:]
    # the facts run comes first and is what the others are measured against: +100 on q0, 0 on q1 (a resample of two
    # draws q1 twice with chance 1/4, so the interval reaches 0); the passages alone: +100 on q0, -100 on q1
    assert table[2:5] == [
        "| reader: facts | `musique-train-facts` (hyperprove) | 2 | 50.00 | 50.00 | 75.00 | 5.00 | – |",
        "| reader: passages; question channel | `musique-train-passages-qc` (hyperprove) | 2 | 100.00 | 100.00 | 75.00 | 5.00 | "
        "+50.00 [+0.00, +100.00] within noise |",
        "| reader: passages-only; question channel | `musique-train-passages-qc` (hyperprove-passages) | 2 | 50.00 | 50.00 | 75.00 | 5.00 | "
        "+0.00 [-100.00, +100.00] within noise |",
    ]
    assert table[6] == ("Commands: `hyperprove evaluate --config experiments/configs/musique-train-facts.json` (commit 0123456789); "
                        "`hyperprove evaluate --config experiments/configs/musique-train-passages-qc.json` (commit 0123456789).")


def test_a_run_without_types_gets_them_from_its_questions_and_a_verdict_per_type(tmp_path):
    # six questions, two types; per question Recall@2 (0-1) of the three systems
    types = {"q0": "comparison", "q1": "comparison", "q2": "comparison", "q3": "inference", "q4": "inference", "q5": "inference"}
    scores = {"hyperprove": [1, 1, 1, 0, 0, 0.5], "ppr": [0, 0, 0, 1, 1, 1], "dense": [1, 1, 1, 0, 0, 0]}
    (tmp_path / "questions.json").write_text(json.dumps([{"id": q, "type": t, "question": "?", "answer": "x"} for q, t in types.items()]))
    run = tmp_path / "2wiki-gold"
    run.mkdir()
    (run / "predictions.json").write_text(json.dumps({name: [{"id": f"q{k}", "recall@2": v} for k, v in enumerate(values)]
                                                      for name, values in scores.items()}))
    (run / "results.json").write_text(json.dumps({"name": "2wiki-gold", "decomposition": "gold", "questions": str(tmp_path / "questions.json"),
                                                  "systems": {name: {"system": name, "n": 6, "recall@2": 100 * sum(v) / 6}
                                                              for name, v in scores.items()}}))
    assert main(["--results", str(tmp_path), "--out", str(tmp_path / "REPORT.md")]) == 0
    report = (tmp_path / "REPORT.md").read_text()
    assert ("### Recall@2 by question type\n\n| system | comparison (3) | inference (3) |\n|---|---:|---:|\n"
            "| hyperprove | 100.00 | 16.67 |\n| ppr | 0.00 | 100.00 |\n| dense | 100.00 | 0.00 |\n") in report
    # comparison: level with dense on every question (ties go to the first peer listed); inference: -100, -100, -50, so
    # a resample's mean is -100 with probability (2/3)^3 = 30% and -50 with (1/3)^3 = 3.7%: both ends sit on those masses
    assert "- comparison: hyperprove 100.00 against ppr 0.00" not in report
    assert "- comparison: hyperprove 100.00 against dense 100.00 (recall@2 +0.00 (95% interval +0.00 to +0.00; 0 up, 0 down, 3 same): within noise)." in report
    assert "- inference: hyperprove 16.67 against ppr 100.00 (recall@2 -83.33 (95% interval -100.00 to -50.00; 0 up, 3 down, 0 same): worse)." in report


def test_compare_pairs_systems_of_two_results_folders(tmp_path):
    import pytest

    from experiments.tools.compare import Subset, compare
    from modules.errors import HyperProveError

    # ten questions in two folders, listed in different orders: the program finds both gold passages on nine, ppr on none;
    # the program answered q0 and q9 by rule
    for name, system, values in (("a", "hyperprove", [1.0] * 9 + [0.5]), ("b", "ppr", [0.0] * 9 + [0.5])):
        (tmp_path / name).mkdir()
        rows = [{"id": f"q{k}", "recall@5": value, **({"by_rule": "..."} if name == "a" and k in (0, 9) else {})} for k, value in enumerate(values)]
        (tmp_path / name / "predictions.json").write_text(json.dumps({system: rows[::-1] if name == "b" else rows}))
    # as in the verdict test: +100 on nine questions, 0 on one -> mean +90, interval +70 to +100
    assert compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["recall@5"]) == [
        f"{tmp_path / 'a'}:hyperprove minus {tmp_path / 'b'}:ppr: recall@5 +90.00 (95% interval +70.00 to +100.00; 9 up, 0 down, 1 same): better; "
        "95.00 against 5.00 on 10 questions"]
    # --first 2: the questions file lists q9 first, then q0; on those two +0 and +100 -> mean +50, both ends reachable
    (tmp_path / "questions.json").write_text(json.dumps([{"id": f"q{k}", "question": "?", "answer": "x", "type": kind}
                                                         for k, kind in ((9, "comparison"), (0, "compositional"), (1, "compositional"))]))
    (tmp_path / "a" / "results.json").write_text(json.dumps({"questions": str(tmp_path / "questions.json")}))
    a_minus_b = f"{tmp_path / 'a'}:hyperprove minus {tmp_path / 'b'}:ppr: recall@5"
    assert compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["recall@5"], Subset(first_n=2)) == [
        f"{a_minus_b} +50.00 (95% interval +0.00 to +100.00; 1 up, 0 down, 1 same): within noise; 75.00 against 25.00 on 2 questions"]
    # answered by rule: q0 and q9, the same two; with the reader: the other eight, +100 each
    assert compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["recall@5"], Subset(where="by-rule")) == \
        compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["recall@5"], Subset(first_n=2))
    assert compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["recall@5"], Subset(where="reader")) == [
        f"{a_minus_b} +100.00 (95% interval +100.00 to +100.00; 8 up, 0 down, 0 same): better; 100.00 against 0.00 on 8 questions"]
    # compositional: q0 and q1, the questions file's only two; with the reader too: q1 alone
    assert compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["recall@5"], Subset(types=("compositional",)))[0].endswith(
        "100.00 against 0.00 on 2 questions")
    assert compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["recall@5"], Subset(where="reader", types=("compositional",)))[0].endswith(
        "100.00 against 0.00 on 1 questions")
    with pytest.raises(HyperProveError, match="fewer than 4 questions"):
        compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["recall@5"], Subset(first_n=4))
    with pytest.raises(HyperProveError, match="'f1' is not scored"):
        compare(f"{tmp_path / 'a'}:hyperprove", f"{tmp_path / 'b'}:ppr", ["f1"])
    with pytest.raises(HyperProveError, match="no system 'dense'"):
        compare(f"{tmp_path / 'a'}:dense", f"{tmp_path / 'b'}:ppr", ["recall@5"])


def test_compare_pools_pairs_of_one_option_over_several_sets(tmp_path):
    import pytest

    from experiments.tools.compare import compare, main, pooled

    # set x: the option gains 100 on q0 and q1 of four; set y: the base run answered six, the option's run (a --limit
    # rerun) four of them, on which it loses 100 on y0. Pooled: +100, +100, 0, 0, -100, 0, 0, 0 -> mean +12.5
    runs = {"x-option": [1, 1, 0, 0], "x-base": [0, 0, 0, 0], "y-option": [0, 1, 1, 1], "y-base": [1, 1, 1, 1, 0, 0]}
    for name, values in runs.items():
        (tmp_path / name).mkdir()
        rows = [{"id": f"{name[0]}{k}", "f1": float(v)} for k, v in enumerate(values)]
        (tmp_path / name / "predictions.json").write_text(json.dumps({"hyperprove": rows}))
    side = {name: f"{tmp_path / name}:hyperprove" for name in runs}
    # the second side answered more: the first side's four questions are the ones paired. A resample of -100, 0, 0, 0
    # has mean -100 with probability (1/4)^4 = 0.4% and -75 or less with 5.1%: the 2.5th percentile is -75
    assert compare(side["y-option"], side["y-base"], ["f1"])[0].endswith("-25.00 (95% interval -75.00 to +0.00; 0 up, 1 down, 3 same): "
                                                                        "within noise; 75.00 against 100.00 on 4 questions")
    lines = pooled([side["x-option"], side["x-base"], side["y-option"], side["y-base"]], ["f1"])
    assert len(lines) == 3 and lines[:2] == compare(side["x-option"], side["x-base"], ["f1"]) + compare(side["y-option"], side["y-base"], ["f1"])
    mean, rest = lines[2].split(" (95% interval ")
    assert mean == "pooled, 2 pairs: f1 +12.50"
    assert rest.endswith("; 2 up, 1 down, 5 same): within noise; 62.50 against 50.00 on 8 questions")
    with pytest.raises(SystemExit):  # an odd side is no pair
        main(["--pooled", side["x-option"], side["x-base"], side["y-option"]])


def test_compare_costs_puts_each_sides_lm_bill_beside_its_scores(tmp_path):
    import pytest

    from experiments.tools.compare import costs
    from modules.errors import HyperProveError

    def step(calls, hits, prompt, cached, generated):
        return {"calls": calls, "cache_hits": hits, "prompt_tokens": prompt, "cached_prompt_tokens": cached, "completion_tokens": generated, "seconds": 0.0}

    # before: 6 calls a question, 1000 prompt tokens of which 700 from the server's cache, 150 generated, 24 and 20 s
    before = [{"id": "q0", "f1": 0.5, "seconds": 24.0, "lm_steps": {"Decomposer": step(1, 0, 200, 150, 40), "HopAnswerer": step(5, 0, 800, 550, 110)}},
              {"id": "q1", "f1": 1.0, "seconds": 20.0, "lm_steps": {"Decomposer": step(1, 0, 200, 150, 40), "HopAnswerer": step(5, 0, 800, 550, 110)}}]
    # after: q0 4 calls (one answered by DSPy's cache), q1 2 calls; q0 lost its half answer
    after = [{"id": "q0", "f1": 0.0, "seconds": 10.0, "lm_steps": {"HopAnswerer": step(4, 1, 500, 400, 30)}},
             {"id": "q1", "f1": 1.0, "seconds": 6.0, "lm_steps": {"HopAnswerer": step(2, 0, 300, 200, 10)}}]
    for name, rows in (("after", after), ("before", before)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "predictions.json").write_text(json.dumps({"hyperprove": rows}))
    a, b = f"{tmp_path / 'after'}:hyperprove", f"{tmp_path / 'before'}:hyperprove"
    lines = costs(a, b, ["f1"])
    # after, per question: 3 calls, 0.5 hits, (800 - 600) / 2 = 100 computed, 300 cached, 20 generated, 8 s, F1 50
    assert lines[2] == f"| {a} | 3.00 | 0.50 | 100 | 300 | 20.0 | 8.0 | 50.00 |"
    assert lines[3] == f"| {b} | 6.00 | 0.00 | 300 | 700 | 150.0 | 22.0 | 75.00 |"
    # per LM module: before's HopAnswerer 5 calls, 250 computed, 550 cached, 110 generated; seconds 0 as scripted
    assert lines[4:9] == ["", "| run | LM module | LM calls/q | computed prompt tok/q | prompt tok/q from the server's cache | generated tok/q | LM s/q |",
                           "|---|---|---:|---:|---:|---:|---:|", f"| {a} | HopAnswerer | 3.00 | 100 | 300 | 20.0 | 0.0 |",
                           f"| {b} | Decomposer | 1.00 | 50 | 150 | 40.0 | 0.0 |"]
    assert lines[9] == f"| {b} | HopAnswerer | 5.00 | 250 | 550 | 110.0 | 0.0 |"
    # F1 per question -50 and 0: mean -25; resamples of two give -50, -25 or 0
    assert lines[11] == f"{a} minus {b}: f1 -25.00 (95% interval -50.00 to +0.00; 0 up, 1 down, 1 same): within noise; 50.00 against 75.00 on 2 questions"
    del before[1]["lm_steps"]  # a run from before the profile (a new folder: predictions are read once per path)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "predictions.json").write_text(json.dumps({"hyperprove": before}))
    with pytest.raises(HyperProveError, match="its predictions hold no lm_steps"):
        costs(a, f"{tmp_path / 'old'}:hyperprove", ["f1"])


def test_compare_choices_puts_back_the_answers_the_chooser_replaced(tmp_path):
    from experiments.tools.compare import choices, without_choices

    # q0: the choice was right (F1 1 -> first answer 0); q1: wrong, but the first answer matched an alias; q2: no choice
    questions = [{"id": "q0", "question": "?", "answer": "Boat People"}, {"id": "q1", "question": "?", "answer": "The Wind", "answer_aliases": ["Wind"]},
                 {"id": "q2", "question": "?", "answer": "1975"}]
    (tmp_path / "questions.json").write_text(json.dumps(questions))
    rows = [{"id": "q0", "answer": "Boat People", "answer_before_choice": "Ann Hui", "em": 1.0, "f1": 1.0, "fallbacks": []},
            {"id": "q1", "answer": "Boat People", "answer_before_choice": "wind", "em": 0.0, "f1": 0.0, "fallbacks": []},
            {"id": "q2", "answer": "1975", "em": 1.0, "f1": 1.0, "fallbacks": []}]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "predictions.json").write_text(json.dumps({"dense": rows}))
    (tmp_path / "run" / "results.json").write_text(json.dumps({"questions": str(tmp_path / "questions.json")}))
    from experiments.runs.results import gold_answers
    from experiments.tools.compare import side_rows

    undone, replaced = without_choices(side_rows(f"{tmp_path / 'run'}:dense"), gold_answers(tmp_path / "run"))
    assert replaced == 2 and [(row["answer"], row["em"], row["f1"]) for row in undone] == [("Ann Hui", 0.0, 0.0), ("wind", 1.0, 1.0), ("1975", 1.0, 1.0)]
    # per question +100, -100, 0: mean 0
    assert choices(f"{tmp_path / 'run'}:dense", ["em"])[0].startswith(
        f"{tmp_path / 'run'}:dense: 2 final answers chosen between the question's options; with the choices minus without: em +0.00 (95% interval -")


def test_the_headline_run_gives_the_answer_claim_with_costs_types_and_failures(tmp_path):
    from experiments.runs.report import render_headline

    # four questions; hyperprove answers all, ppr half of each, bm25 none: every per-question
    # difference is the same, so each bootstrap interval is that one value
    f1s = {"hyperprove": [1.0] * 4, "bm25": [0.0] * 4, "ppr": [0.5] * 4, "hyperprove-passages": [0.75] * 4}
    (tmp_path / "predictions.json").write_text(json.dumps(
        {name: [{"id": f"q{k}", "f1": f1} for k, f1 in enumerate(values)] for name, values in f1s.items()}))
    failures = lambda right, reader: {"right": right, "decomposition": {"n": 0, "examples": []},  # noqa: E731
                                      "retrieval": {"n": 4 - right - reader, "examples": []}, "bridge": {"n": 0, "examples": []},
                                      "final reader": {"n": reader, "examples": []}}
    systems = {
        "hyperprove": {"em": 100.0, "f1": 100.0, "recall@5": 90.0, "lm_calls_per_question": 4.25, "seconds_per_question": 14.51,
                       "per_type": {"comparison": {"n": 3, "f1": 100.0}, "compositional": {"n": 1, "f1": 100.0}}, "failures": failures(4, 0)},
        "bm25": {"em": 0.0, "f1": 0.0, "recall@5": 60.0, "lm_calls_per_question": 1.0, "seconds_per_question": 6.0,
                 "per_type": {"comparison": {"n": 3, "f1": 0.0}}, "failures": failures(0, 1)},
        "ppr": {"em": 0.0, "f1": 50.0, "recall@5": 70.0, "lm_calls_per_question": 1.0, "seconds_per_question": 6.04,
                "per_type": {"comparison": {"n": 3, "f1": 50.0}, "compositional": {"n": 1, "f1": 50.0}}, "failures": failures(0, 4)},
        "hyperprove-passages": {"em": 50.0, "f1": 75.0, "recall@5": 90.0, "lm_calls_per_question": 1.0, "seconds_per_question": 3.0},
    }
    run = {"name": "2wiki-lm300", "n_questions": 4, "config": {"evaluation": {"skip": 60}}, "results_dir": str(tmp_path),
           "systems": {name: {"system": name, "n": 4, **summary} for name, summary in systems.items()}}
    other = {"name": "2wiki-lm60", "n_questions": 60, "systems": {"hyperprove": {"em": 1.0, "f1": 2.0, "recall@5": 3.0}}}
    assert render_headline([other, run]) == [
        "Each set's dev questions that no earlier run saw, every peer's top 5 through the program's final reader: HyperProve minus its best "
        "peer on F1 and minus ppr on Recall@5 (mean [paired bootstrap 95% interval]), in %; a program compiled on the set's train "
        "split under its built-in one:", "",
        "| run | program | dev questions | HyperProve F1 | best peer F1 | F1 minus best peer | × best peer | HyperProve R@5 | R@5 minus ppr "
        "| LM calls/q (s/q) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        # no recall@5 in the predictions: no paired R@5 difference
        "| 2wiki-lm300 | built-in | 61-64 (4) | 100.00 | 50.00 (ppr) | +50.00 [+50.00, +50.00] | 2.00 | 90.00 | – | 4.25 (14.5) |", "",
        "`2wiki-lm300`: dev questions 61-64 (4); the program answers by itself, every other system hands its top 5 passages to "
        "the program's final reader. EM / F1 / R@5 in %, LM calls and seconds a question:", "",
        "| system | EM | F1 | R@5 | LM calls/q | s/q |", "|---|---:|---:|---:|---:|---:|",
        "| hyperprove | 100.00 | 100.00 | 90.00 | 4.25 | 14.5 |",
        "| bm25 | 0.00 | 0.00 | 60.00 | 1.00 | 6.0 |",
        "| ppr | 0.00 | 50.00 | 70.00 | 1.00 | 6.0 |",
        "| hyperprove-passages | 50.00 | 75.00 | 90.00 | 1.00 | 3.0 |", "",
        "- F1, hyperprove minus bm25: +100.00 [+100.00, +100.00] (up on 4 questions, down on 0), ahead.",
        "- F1, hyperprove minus ppr: +50.00 [+50.00, +50.00] (up on 4 questions, down on 0), ahead.",
        "- F1, hyperprove minus hyperprove-passages (its own top 5 through the peers' reader): +25.00 [+25.00, +25.00], ahead.",
        "- hyperprove's F1 is 2.00 times the best peer's (ppr).", "",
        "Answered right, and the wrong answers by the first stage that failed (after retrieval: the right passages were there):", "",
        "| system | right | decomposition | retrieval | bridge | final reader |", "|---|---:|---:|---:|---:|---:|",
        "| hyperprove | 4 | 0 | 0 | 0 | 0 |", "| bm25 | 0 | 0 | 3 | 0 | 1 |", "| ppr | 0 | 0 | 0 | 0 | 4 |", ""]
    # without the headline run, the 60-question runs' table
    assert render_headline([other])[0].startswith("The first 60 dev questions of each set")
    # its rerun with today's defaults leads, with the change since the first run: the first run's
    # program had F1 0.5 on each question, so +50 on all four
    first = tmp_path / "first"
    first.mkdir()
    (first / "predictions.json").write_text(json.dumps({"hyperprove": [{"id": f"q{k}", "f1": 0.5} for k in range(4)]}))
    then = {"name": "2wiki-lm300", "n_questions": 4, "results_dir": str(first),
            "systems": {"hyperprove": {"f1": 50.0, "lm_calls_per_question": 5.0}}}
    # its calls partly replayed: hyperprove's 17 calls, 9 of them from the record; ppr's 4, all from it
    final = {**run, "name": "2wiki-lm300-final", "systems": {name: {**summary, "lm_cache_hits": {"hyperprove": 9, "ppr": 4}.get(name, 0)}
                                                             for name, summary in run["systems"].items()}}
    lines = render_headline([then, final, other])
    assert lines[4].startswith("| 2wiki-lm300-final | built-in | 61-64 (4) | 100.00 |")  # the rerun stands for the set
    assert lines[4].endswith("| 4.25 (14.5; 2.25 replayed) |")  # 9 of its 17 calls from the record
    lines = lines[6:]
    assert lines[0].startswith("`2wiki-lm300-final`: dev questions 61-64 (4)") and lines[0].endswith(
        "(calls the record or the cache answered take no LM time, so s/q is not all LM time):")
    assert lines[2:5] == ["| system | EM | F1 | R@5 | LM calls/q | of them cached/q | s/q |", "|---|---:|---:|---:|---:|---:|---:|",
                          "| hyperprove | 100.00 | 100.00 | 90.00 | 4.25 | 2.25 | 14.5 |"]
    assert lines[6] == "| ppr | 0.00 | 50.00 | 70.00 | 1.00 | 1.00 | 6.0 |"
    assert lines[lines.index("- hyperprove's F1 is 2.00 times the best peer's (ppr).") + 1] == (
        "- F1, hyperprove minus the same questions' first run (`2wiki-lm300`, before today's defaults): 50.00 → 100.00, "
        "+50.00 [+50.00, +50.00] (up on 4 questions, down on 0), better; LM calls a question 5.00 → 4.25.")


def test_a_compiled_program_has_its_own_row_its_peers_rerun_under_it_and_its_change_against_the_built_in(tmp_path):
    from experiments.runs.report import render_compiled, render_sets

    def write(name, scores, program=None):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "predictions.json").write_text(json.dumps({system: [{"id": f"q{k}", "f1": f1, "recall@5": recall}
                                                                      for k, (f1, recall) in enumerate(zip(*values))]
                                                             for system, values in scores.items()}))
        systems = {system: {"n": 2, "f1": 50.0 * sum(f1s), "recall@5": 50.0 * sum(recalls), "lm_calls_per_question": 5.0,
                            "seconds_per_question": 20.0} for system, (f1s, recalls) in scores.items()}
        config = {"evaluation": {"questions": "q.json", "skip": 60}, **({"program": {"compiled": program}} if program else {})}
        return {"name": name, "n_questions": 2, "results_dir": str(folder), "config": config, "systems": systems}

    # built-in: hyperprove F1 0 and 0.5, ppr 0.25 each, dense-iterative 0; the compiled program 1 and 0.5;
    # under it dense-iterative (which reads the program's sub-queries) rises to 0.5 each and is the best peer
    base = write("musique-more-lm95", {"hyperprove": ([0.0, 0.5], [0.5, 0.5]), "ppr": ([0.25, 0.25], [0.5, 1.0]),
                                       "dense-iterative": ([0.0, 0.0], [0.5, 0.5])})
    steps = write("musique-more-lm95-steps", {"hyperprove": ([1.0, 0.5], [1.0, 1.0])}, "experiments/programs/tiny.json")
    peers = write("musique-more-lm95-steps-peers", {"hyperprove": ([1.0, 0.5], [1.0, 1.0]), "dense-iterative": ([0.5, 0.5], [0.5, 0.5])},
                  "experiments/programs/tiny.json")
    other = write("musique-more-lm95-other", {"hyperprove": ([1.0, 1.0], [1.0, 1.0])}, "experiments/programs/tiny.json")
    other["config"]["evaluation"]["skip"] = 0  # other questions: not this set's
    runs = [base, steps, peers, other]
    # per question against the best peer: built-in -25 and +25 (ppr); compiled +50 and 0 (dense-iterative, from the peers'
    # rerun); R@5 against ppr (which does not read the program: the built-in run's) 0 and -50, then +50 and 0
    assert render_sets(runs)[4:] == [
        "| musique-more-lm95 | built-in | 61-62 (2) | 25.00 | 25.00 (ppr) | +0.00 [-25.00, +25.00] | 1.00 | 50.00 | -25.00 [-50.00, +0.00] | 5.00 (20.0) |",
        "| musique-more-lm95-steps | `tiny` | 61-62 (2) | 75.00 | 50.00 (dense-iterative) | +25.00 [+0.00, +50.00] | 1.50 | 100.00 | "
        "+25.00 [+0.00, +50.00] | 5.00 (20.0) |", ""]
    # against the built-in program: F1 +100 and 0, R@5 +50 on both; no compile record and no compile config: the program's path
    assert render_compiled(runs)[2:] == [
        "| built-in | compiled | made by | making it | F1 | F1 change | R@5 change |", "|---|---|---|---|---:|---:|---:|",
        "| musique-more-lm95 | musique-more-lm95-steps | `experiments/programs/tiny.json` | – | 25.00 → 75.00 | +50.00 [+0.00, +100.00] | "
        "+50.00 [+50.00, +50.00] |", ""]
    # a rerun with the chosen defaults stands for the set; it replayed all 10 of its calls, so its cost is the run that made them
    chosen = {**base, "name": "musique-more-lm95-chosen", "config": {**base["config"], "lm": {"replay": "experiments/results/musique-more-lm95"}},
              "systems": {**base["systems"], "hyperprove": {**base["systems"]["hyperprove"], "seconds_per_question": 0.1, "lm_cache_hits": 10}}}
    assert render_sets([chosen, *runs])[4].startswith("| musique-more-lm95-chosen | built-in |")
    assert render_sets([chosen, *runs])[4].endswith("| 5.00 (20.0) in `musique-more-lm95` |")
    assert render_sets([{**chosen, "systems": {**chosen["systems"], "hyperprove": {**chosen["systems"]["hyperprove"], "lm_cache_hits": 8}}},
                        *runs])[4].endswith("| 5.00 (0.1; 4.00 replayed) |")  # 8 of 10: its own cost
    # a newer rerun with another retriever stands for the set; the compiled program keeps its row, against the newest
    # run of its own setting (the chosen rerun, not the first run)
    lexical = {**chosen, "name": "musique-more-lm95-lexical", "config": {**chosen["config"], "retriever": {"lexical_seeds": 10}}}
    table = render_sets([lexical, chosen, *runs])
    assert table[4].startswith("| musique-more-lm95-lexical | built-in |") and table[5].startswith("| musique-more-lm95-steps | `tiny` |")
    assert render_compiled([lexical, chosen, *runs])[4].startswith("| musique-more-lm95-chosen | musique-more-lm95-steps |")


def test_a_run_that_replays_the_parts_that_made_its_calls_costs_what_they_did():
    from experiments.runs.report import live_cost

    def run(name, program, n, calls, seconds, hits=0, replay=None):
        config = {"program": {"compiled": program}, **({"lm": {"replay": replay}} if replay else {})}
        return {"name": name, "config": config, "systems": {"hyperprove": {"n": n, "lm_calls_per_question": calls,
                                                                           "seconds_per_question": seconds, "lm_cache_hits": hits}}}

    base = run("set-lm300", None, 3, 4.0, 18.0)
    part1 = run("set-traced-1", "p.json", 1, 6.0, 30.0, hits=1, replay="experiments/results/set-lm300")
    part2 = run("set-traced-2", "p.json", 2, 4.5, 15.0, replay="experiments/results/set-lm300")
    whole = run("set-traced", "p.json", 3, 5.0, 0.1, hits=15,
                replay="experiments/results/set-lm300, experiments/results/set-traced-1, experiments/results/set-traced-2")
    named = {r["name"]: r for r in (base, part1, part2, whole)}
    # the built-in run is another program: left out; the parts by questions: calls (6 + 2 * 4.5) / 3, seconds (30 + 2 * 15) / 3
    assert live_cost(named, whole) == "5.00 (20.0; 0.33 replayed) in `set-traced-1 + set-traced-2`"
    assert live_cost(named, part2) == "4.50 (15.0)"  # made its own calls


def test_reruns_pair_today_s_program_with_the_first_run_and_with_the_rerun_s_peers(tmp_path):
    from experiments.runs.report import render_headline, render_reruns

    def write(name, f1s, recalls, systems):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "predictions.json").write_text(json.dumps({system: [{"id": f"q{k}", "f1": f1, "recall@5": recall}
                                                                      for k, (f1, recall) in enumerate(zip(f1s[system], recalls[system]))]
                                                             for system in f1s}))
        return {"name": name, "n_questions": 2, "results_dir": str(folder), "systems": systems}

    # then: hyperprove F1 0 and 0.5 (mean 25), R@5 0.5 each; now: 1 and 1 (mean 100), R@5 1 each;
    # per question F1 +100 and +50 (bootstrap over {100, 50}: mean 75, interval [50, 100]), R@5 +50 both
    then = write("musique-lm60", {"hyperprove": [0.0, 0.5]}, {"hyperprove": [0.5, 0.5]},
                 {"hyperprove": {"f1": 25.0, "recall@5": 50.0, "lm_calls_per_question": 5.5}})
    now = write("musique-lm60-final", {"hyperprove": [1.0, 1.0], "ppr": [0.0, 0.0], "hyperprove-passages": [0.5, 0.5]},
                {"hyperprove": [1.0, 1.0], "ppr": [1.0, 1.0], "hyperprove-passages": [1.0, 1.0]},
                {"hyperprove": {"f1": 100.0, "recall@5": 100.0, "lm_calls_per_question": 3.0, "seconds_per_question": 12.34},
                 "ppr": {"f1": 0.0, "recall@5": 100.0}, "hyperprove-passages": {"f1": 50.0, "recall@5": 100.0}})
    lines = render_reruns([now, then], heading=False)
    # the rerun's best peer (its only one, ppr) on F1: +100 both questions; on R@5 level
    assert lines[2:] == [
        "| set | F1 then → now | F1 change | R@5 then → now | R@5 change | F1 minus best peer | R@5 minus ppr | LM calls/q then → now (s/q now) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        "| musique | 25.00 → 100.00 | +75.00 [+50.00, +100.00] | 50.00 → 100.00 | +50.00 [+50.00, +50.00] | "
        "+100.00 [+100.00, +100.00] (ppr) | +0.00 [+0.00, +0.00] | 5.50 → 3.00 (12.3) |", ""]
    # the report adds every peer of each rerun; the program's own passages path is not a peer
    assert render_reruns([now, then])[-3:] == ["|---|---|---:|---:|", "| musique-lm60-final | ppr | +100.00 [+100.00, +100.00] | +0.00 [+0.00, +0.00] |", ""]
    assert render_reruns([now]) == [] and render_headline([now, then])[0].startswith("The first 60 dev questions of each set")


def test_each_lm_run_says_whether_reproduce_replays_its_calls():
    from experiments.runs.report import ROOT, recorded_calls

    folder = str(ROOT / "experiments" / "results" / "x-lm60")
    assert recorded_calls({"name": "x-lm60", "results_dir": folder, "lm_calls": {"calls": 2078, "bytes": 1670433}}) == (
        "2,078 LM calls recorded (1.67 MB; `hyperprove reproduce experiments/results/x-lm60` replays them)")
    assert recorded_calls({"name": "y", "results_dir": "/elsewhere/y"}) == (
        "no LM calls recorded (made before runs recorded them; `hyperprove reproduce /elsewhere/y` asks the LM again)")
