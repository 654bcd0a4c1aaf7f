"""MLflow tracking: flat params, metric names, and one logged run read back."""

import json

from optimize.tracking import flat_params, log_evaluation, metric_name
from pipeline.config import HyperProveConfig, TrackingConfig


def test_flat_params_and_metric_names():
    assert flat_params({"retriever": {"alpha": 0.9, "depth": 2}, "evaluation": {"retrievers": ["dense", "ppr"], "limit": None}, "cache_dir": "c"}) == {
        "retriever.alpha": "0.9", "retriever.depth": "2", "evaluation.retrievers": '["dense", "ppr"]', "evaluation.limit": "null", "cache_dir": "c",
    }
    assert metric_name("hyperprove-fixed", "recall@5") == "hyperprove-fixed.recall_at_5"


def test_a_run_holds_config_metrics_and_artifacts(tmp_path):
    from mlflow.tracking import MlflowClient

    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path}/store/mlflow.db", artifacts=str(tmp_path / "artifacts"), experiment="t")
    (tmp_path / "results.md").write_text("| system |\n")
    config = HyperProveConfig().to_dict()
    systems = {"dense": {"system": "dense", "n": 3, "recall@5": 66.67, "em": None}}
    run_id = log_evaluation(tracking, config, systems, {"table": tmp_path / "results.md"}, "toy", {"hyperprove.lm": "dummy"})
    run = MlflowClient(tracking_uri=tracking.uri).get_run(run_id)
    assert run.info.run_name == "toy" and run.data.tags["hyperprove.lm"] == "dummy"
    assert run.data.metrics == {"dense.n": 3.0, "dense.recall_at_5": 66.67}  # None and text are not metrics
    assert run.data.params["retriever.alpha"] == str(config["retriever"]["alpha"])
    assert len(run.data.params) == len(flat_params(config))
    assert (tmp_path / "artifacts").is_dir() and run.info.artifact_uri.startswith((tmp_path / "artifacts").as_uri())
    env = json.loads((tmp_path / "artifacts" / run.info.artifact_uri.split("/artifacts/", 1)[1] / "environment.json").read_text())
    assert "dspy" in env["packages"]
