"""The generated report: run order, the verdict line, and the rendered sections."""

import json

from experiments.report import load_runs, main, verdict


def test_verdict_compares_hyperprove_with_the_best_baseline():
    systems = {"dense": {"recall@5": 57.78}, "ppr": {"recall@5": 59.72}, "hyperprove": {"recall@5": 79.58}}
    assert verdict(systems) == "Recall@5: hyperprove 79.58 is ahead of the best baseline, ppr 59.72 (+19.86)."
    fixed = {"ppr": {"recall@5": 89.17}, "hyperprove-fixed": {"recall@5": 83.33}}
    assert verdict(fixed) == "Recall@5: hyperprove-fixed 83.33 is behind the best baseline, ppr 89.17 (-5.84)."
    assert verdict({"dense": {"recall@5": 1.0}}) == ""


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
    assert [run["name"] for run in load_runs(tmp_path)] == ["musique-retrieval", "hotpotqa-retrieval", "musique-lm60"]
    assert main(["--results", str(tmp_path), "--out", str(tmp_path / "REPORT.md")]) == 0
    report = (tmp_path / "REPORT.md").read_text()
    assert report.index("## musique-retrieval") < report.index("## hotpotqa-retrieval") < report.index("## musique-lm60")
    assert "command: `hyperprove evaluate --config experiments/configs/musique-lm60.json`; 60 questions; commit 0123456789; MLflow run `abc`." in report
    assert "| hyperprove | 60 | 45.00 | 55.00 | – | – | – | – | – |" in report
    assert report.count("is ahead of the best baseline, dense 50.00 (+5.00).") == 3


def test_a_sweep_is_rendered_with_its_held_out_check(tmp_path):
    from experiments.report import render_sweep

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


def test_a_compiled_run_is_compared_with_the_same_setting_uncompiled():
    from experiments.report import compiled_program

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


def test_the_compile_record_says_whether_the_grade_was_held_out(tmp_path):
    import json

    from experiments.report import compiled_program

    program = tmp_path / "p.json"
    record = {"target": "decompose", "optimizer": "mipro", "train_examples": 20, "val_examples": 20, "val_before": 37.55,
              "val_after": 48.35, "lm_calls": 300, "git_commit": "0123456789abcdef", "program_sha256": "abc"}
    run = {"name": "compiled", "program_sha256": "abc", "config": {"program": {"compiled": str(program)}}, "systems": {}}
    for selects, words in ((True, "training examples it also chose on"), (False, "held-out training examples")):
        (tmp_path / "p.record.json").write_text(json.dumps({**record, "val_selects": selects}))
        assert compiled_program(run, [run])[0] == (
            f"Program: `{program}`, compiled by `hyperprove compile` (decompose with mipro, 20 training examples, 300 LM calls, "
            f"commit 0123456789); its grade on 20 {words} went from 37.55 to 48.35.")


def test_a_compiled_run_is_compared_question_by_question_when_predictions_are_there(tmp_path):
    import json

    from experiments.report import compiled_program

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
