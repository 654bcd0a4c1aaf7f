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
