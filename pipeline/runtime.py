"""What a command runs with besides its config: the LM session and the embedder.

Each is made on first use, so a command that needs no LM never starts the local model. A Python
API user (or a test) hands in others: `Runtime(config, lm=dspy.utils.DummyLM(...), embedder=...)`.
"""

from __future__ import annotations

from functools import cached_property


class Runtime:
    def __init__(self, config, lm=None, embedder=None):
        self.config = config
        self._lm, self._embedder = lm, embedder

    @cached_property
    def session(self):
        """The `pipeline.lm.LMSession`: the LM, its cache and its call counter."""
        from pipeline.lm import LMSession

        return LMSession(self.config, self._lm)

    @property
    def lm_started(self) -> bool:
        return "session" in self.__dict__

    def calls(self) -> int:
        """LM calls so far (0 when no LM was started)."""
        return self.session.calls() if self.lm_started else 0

    @cached_property
    def embedder(self):
        if self._embedder is not None:
            return self._embedder
        from pipeline.embedder import Embedder

        index = self.config.index
        return Embedder(index.embedder, batch_size=index.batch_size, cache_dir=self.config.cache_dir)
