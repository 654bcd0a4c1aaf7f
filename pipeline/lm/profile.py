"""What the LM modules cost: every LM call counted for the LM module that made it (calls, cache
hits, prompt tokens, of those the ones the server's prompt cache served, generated tokens, seconds).
Stored rows and answer records keep these under their `lm_steps` key, the name runs were written with."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Callable

import dspy
from dspy.utils.callback import BaseCallback

from pipeline.scope import current


@dataclass
class ModuleCost:
    """What one LM module's calls cost: calls (DSPy cache hits included), cache hits (no request made), prompt
    tokens, of those the ones the server reused from its prompt cache, generated tokens, seconds."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def minus(self, other: "ModuleCost") -> "ModuleCost":
        return ModuleCost(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def add(self, other: "ModuleCost") -> None:
        for name in (f.name for f in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def module_of(caller_modules, fallback: str = "lm") -> str:
    """The LM module an LM call belongs to: the innermost calling module that is ours, not DSPy's
    (`Decomposer`, `HopAnswerer`, ...): a predictor inside it (a `dspy.Predict`, ours included) is
    an implementation detail."""
    for module in reversed(caller_modules or []):
        if type(module).__module__.split(".")[0] != "dspy" and not isinstance(module, dspy.Predict):
            return type(module).__name__
    return fallback


class CacheLookups:
    """Counts, per thread, the lookups DSPy's LM cache answered. DSPy 3.4 marks a hit only on its
    internal call result: the history entry a callback reads has the empty usage that a provider
    reporting none also leaves. So the lookup itself is watched (`cache.get`, the one DSPy calls)."""

    def __init__(self, cache):
        self._local = threading.local()
        lookup = cache.get

        def get(*args, **kwargs):
            found = lookup(*args, **kwargs)
            if found is not None:
                self._local.hits = self.hits + 1
            return found

        cache.get = get

    @property
    def hits(self) -> int:
        """Hits so far in the calling thread (an LM call looks up and answers in one thread)."""
        return getattr(self._local, "hits", 0)


class LMProfile(BaseCallback):
    """Counts, per LM module, what every LM call cost (`ModuleCost`), from the usage the provider
    reports (llama.cpp and OpenAI-style APIs report prompt, cached prompt and generated tokens) and
    the wall time around the call; a call DSPy's cache answered is a cache hit (`lookups`).
    Thread-safe. Each call also counts for the question it was made for (`pipeline.scope`, its
    `costs`); `snapshot()` gives the whole session's so far."""

    def __init__(self, lookups: CacheLookups | None = None):
        self.lookups = lookups
        self._lock = threading.Lock()
        self._open: dict[str, tuple] = {}
        self.modules: dict[str, ModuleCost] = {}
        self.listeners: list[Callable[[str, ModuleCost], None]] = []  # each sees (LM module, this call's cost) as a call ends

    def on_lm_start(self, call_id, instance, inputs):
        callers = dspy.settings.caller_modules or []
        owner = callers[-1] if callers else instance  # DSPy appends the call's record to its history
        history = getattr(owner, "history", None) or []
        hits = self.lookups.hits if self.lookups else 0
        with self._lock:
            self._open[call_id] = (module_of(callers), owner, history[-1] if history else None, hits, time.perf_counter())

    def on_lm_end(self, call_id, outputs, exception=None):
        with self._lock:
            opened = self._open.pop(call_id, None)
        if opened is None:
            return
        module, owner, before, hits, started = opened
        seconds = time.perf_counter() - started
        history = getattr(owner, "history", None) or []
        entry = history[-1] if exception is None and history and history[-1] is not before else {}
        usage = entry.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        hit = bool(getattr(entry.get("response"), "cache_hit", False)) or bool(self.lookups and self.lookups.hits > hits)
        call = ModuleCost(calls=1, cache_hits=int(hit), prompt_tokens=usage.get("prompt_tokens") or 0, cached_prompt_tokens=cached,
                          completion_tokens=usage.get("completion_tokens") or 0, seconds=seconds)
        with self._lock:
            self.modules.setdefault(module, ModuleCost()).add(call)
        costs = current().costs
        if costs is not None:  # the question's own: an LM call ends in the thread (and context) that made it
            costs.setdefault(module, ModuleCost()).add(call)
        for listener in self.listeners:
            listener(module, call)

    @property
    def calls(self) -> int:
        with self._lock:
            return sum(cost.calls for cost in self.modules.values())

    def snapshot(self) -> dict[str, ModuleCost]:
        with self._lock:
            return {module: replace(cost) for module, cost in self.modules.items()}


def profile_delta(after: dict[str, ModuleCost], before: dict[str, ModuleCost]) -> dict[str, ModuleCost]:
    """What was spent between two snapshots, per LM module that made a call."""
    spent = {module: cost.minus(before.get(module, ModuleCost())) for module, cost in after.items()}
    return {module: cost for module, cost in spent.items() if cost.calls}


def profile_table(modules: dict[str, dict]) -> str:
    """A markdown table of a profile (LM module -> ModuleCost fields), with a total row."""
    names = [f.name for f in fields(ModuleCost)]
    total = {name: sum(cost[name] for cost in modules.values()) for name in names}
    head = "| LM module | calls | DSPy cache hits | prompt tokens | served from the prompt cache | generated tokens | seconds |"
    lines = [head, "|---|" + "---:|" * len(names)]
    for module, cost in [*modules.items(), ("total", total)]:
        cells = [f"{cost[name]:.4g}" if isinstance(cost[name], float) else str(cost[name]) for name in names]
        lines.append(f"| {module} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
