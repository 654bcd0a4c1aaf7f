"""MLflow below the experiments: the store connection, and one trace per question the LM answers.

The program's commands (`ask`, `demo`) and evaluations trace questions through `Runtime`;
MLflow is imported only when a store is opened or tracing is on.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

from modules.errors import HyperProveError, first_line


def make_sqlite_folder(uri: str) -> None:
    """A local SQLite store's folder must exist before MLflow or Optuna opens it."""
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


def experiment_id(mlflow, tracking) -> str:
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        return experiment.experiment_id
    return mlflow.create_experiment(tracking.experiment, artifact_location=Path(tracking.artifacts).resolve().as_uri())


def connect(tracking):
    """mlflow, pointed at the configured store (its folder created for a local SQLite path)."""
    import mlflow

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    make_sqlite_folder(tracking.uri)
    mlflow.set_tracking_uri(tracking.uri)
    return mlflow


class QuestionTraces:
    """One MLflow trace per question that the LM answers (`ask`, `demo`, LM `evaluate`).

    DSPy's autolog gives the spans: each module of the program (Decomposer, BridgeRewriter,
    HypergraphRetriever with its own trace in its outputs: seeds, frontier, subgraph size and
    edges, candidates, scored facts, passages; HopAnswerer, AnswerGenerator) and under them
    every LM call with its prompt, output and token usage. A root span per question holds them,
    the fallbacks become its events, and `evaluate` tags the trace with the question id, the
    gold answer, EM/F1 and whether the gold passages were reached, so the UI can filter failures.
    """

    def __init__(self, tracking, profile=None):
        import mlflow.dspy

        self.profile = profile  # the session's `pipeline.lm.profile.LMProfile`: each call's tokens go onto its span
        if profile is not None:
            profile.listeners.append(self.record_call)
        self.mlflow = connect(tracking)
        try:
            self.mlflow.set_experiment(experiment_id=experiment_id(self.mlflow, tracking))
        except Exception as error:  # noqa: BLE001 - any store failure is one line for the user
            raise HyperProveError(f"tracking store {tracking.uri}: {type(error).__name__}: {first_line(error)}") from None
        mlflow.dspy.autolog(log_traces=True, log_traces_from_compile=False, log_traces_from_eval=False, silent=True)
        self.ids: list[str] = []

    @contextmanager
    def question(self, text: str, system: str = "hyperprove"):
        """The trace of one question; yields `finish(answer, fallbacks, tags)` to record its outcome."""
        from mlflow.entities import SpanEvent

        with self.mlflow.start_span(name=system, span_type="CHAIN") as root:
            root.set_inputs({"question": text})

            def finish(answer: str, fallbacks=(), tags: dict | None = None) -> None:
                root.set_outputs({"answer": answer})
                for note in fallbacks:
                    root.add_event(SpanEvent("fallback", attributes={"note": note}))
                self.mlflow.update_current_trace(tags={"hyperprove.system": system, **{k: str(v) for k, v in (tags or {}).items()}})

            yield finish
        self.ids.append(root.trace_id)

    def record_call(self, step: str, call) -> None:
        """One LM call's bill on the span that made it (DSPy's Predict span: the LM's own span has
        ended by the time the bill is known)."""
        span = self.mlflow.get_current_active_span()
        if span is not None:
            span.set_attributes({"hyperprove.step": step, "lm.prompt_tokens": call.prompt_tokens,
                                 "lm.cached_prompt_tokens": call.cached_prompt_tokens, "lm.completion_tokens": call.completion_tokens,
                                 "lm.seconds": round(call.seconds, 3), "lm.cache_hit": bool(call.cache_hits)})

    def close(self, run_id: str | None = None) -> int:
        """Write what is still queued, link the traces to the run that logged the results, and
        turn autolog off again; returns the number of traces."""
        import mlflow.dspy

        self.mlflow.flush_trace_async_logging()
        if run_id:
            client = self.mlflow.tracking.MlflowClient()
            for start in range(0, len(self.ids), 100):
                client.link_traces_to_run(self.ids[start:start + 100], run_id)
        mlflow.dspy.autolog(disable=True)
        if self.profile is not None and self.record_call in self.profile.listeners:
            self.profile.listeners.remove(self.record_call)
        return len(self.ids)
