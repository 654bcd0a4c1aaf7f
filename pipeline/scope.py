"""One question's scope: who asks (the system and the question's id), who hears its progress, and
where its LM costs go. The program, the LM call record and the LM profile all read it here.

A context variable, so that one program answering in several threads at once keeps each question
apart: a thread's LM calls are recorded as its own question's, its hops reach its own listener,
and its costs its own tally. The one other piece of state shared by a process is DSPy's LM and
adapter, which `pipeline.lm.session.LMSession` sets once for every thread (`dspy.configure`).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Callable, Iterator


@dataclass(frozen=True)
class Scope:
    """What is known of the question being answered in this context (nothing, outside one)."""

    system: str | None = None  # the system answering (`--retriever` name): who the LM call record says asked
    question: str | None = None  # the question's id
    listener: Callable[[str, dict], None] | None = None  # hears ("plan", {"sub_questions"}), then ("hop", chain entry)
    costs: dict | None = None  # LM module name -> `pipeline.lm.profile.ModuleCost` of this question's calls

    def spent(self) -> dict:
        """This question's LM costs, per LM module that made a call."""
        return {module: cost for module, cost in (self.costs or {}).items() if cost.calls}

    def progress(self, event: str, data: dict) -> None:
        """Tell the listener, if any, that the plan or a hop is ready."""
        if self.listener is not None:
            self.listener(event, data)


_SCOPE: ContextVar[Scope] = ContextVar("hyperprove_scope", default=Scope())


def current() -> Scope:
    return _SCOPE.get()


@contextmanager
def scoped(**changes) -> Iterator[Scope]:
    """The current scope with `changes` (fields of `Scope`) inside the block; `costs={}` starts a
    fresh tally that the block's LM calls add to."""
    scope = replace(_SCOPE.get(), **changes)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)
