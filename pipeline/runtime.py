"""What a command runs with besides its config: the LM session, the embedder, the question traces.

Each is made on first use, so a command that needs no LM never starts the local model. A Python
API user (or a test) hands in others: `Runtime(config, lm=dspy.utils.DummyLM(...), embedder=...)`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from functools import cached_property

from pipeline.traces import QuestionTraces

# Third-party settings every process of ours runs with (the command line's, and a Ray worker's):
# no reaching for the network at import or first use, and no progress bars of MLflow's own between ours.
LIBRARY_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "TOKENIZERS_PARALLELISM": "false",
    "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def apply_library_defaults() -> None:
    """Set `LIBRARY_DEFAULTS` where the environment does not say otherwise."""
    for name, value in LIBRARY_DEFAULTS.items():
        os.environ.setdefault(name, value)


@contextmanager
def no_trace(text: str, system: str = "hyperprove"):
    """A question's context when nothing is traced; yields the same `finish` as a trace does."""
    yield lambda answer, fallbacks=(), tags=None: None


class Runtime:
    def __init__(self, config, lm=None, embedder=None):
        """`LIBRARY_DEFAULTS` are set here too, so that a Python API user, who never passes through
        the command line, stays offline (without them DSPy fetches a model price list from the web
        when its first LM is made)."""
        apply_library_defaults()
        self.config = config
        self._lm, self._embedder = lm, embedder

    @cached_property
    def session(self):
        """The `pipeline.lm.session.LMSession`: the LM, its cache and its call counter."""
        from pipeline.lm.session import LMSession

        return LMSession(self.config, self._lm)

    @property
    def lm_id(self) -> str:
        """The id of the LM this runtime answers with (`LMSession.id`), without starting it."""
        return str(getattr(self._lm, "model", type(self._lm).__name__)) if self._lm is not None else self.config.lm.id

    @property
    def lm_started(self) -> bool:
        return "session" in self.__dict__

    def calls(self) -> int:
        """LM calls so far (0 when no LM was started)."""
        return self.session.calls() if self.lm_started else 0

    @cached_property
    def traces(self):
        """`pipeline.traces.QuestionTraces` when tracking and traces are on, else None."""
        tracking = self.config.tracking
        if not (tracking.enabled and tracking.traces):
            return None

        return QuestionTraces(tracking, self.session.profile)

    @property
    def traces_started(self) -> bool:
        return self.__dict__.get("traces") is not None

    def question_trace(self, text: str, system: str = "hyperprove"):
        """The context of one question: its MLflow trace, or nothing when traces are off."""
        return (self.traces.question if self.traces is not None else no_trace)(text, system)

    @cached_property
    def embedder(self):
        if self._embedder is not None:
            return self._embedder
        from pipeline.index.embedder import Embedder

        index = self.config.index
        return Embedder(index.embedder, batch_size=index.batch_size, cache_dir=self.config.cache_dir)
