"""LM work on a Ray cluster: a pool of workers, each with its own LM session at one of the
configured endpoints, handed batches (of passages to extract, of questions to answer) and handing
back what the driver keeps.

Why Ray actors, and not Ray Data or a task per item: a worker builds its LM session (and, for
questions, loads the corpus, the index and the embedder) once and keeps it for every batch, and an
item is one to a handful of LM calls whose latency, not their computation, is the cost, so what
matters is keeping every endpoint busy; an `ActorPool` does that and streams results back as
batches finish, for the progress bar and for the driver to keep at once. Ray Data's streaming
operators would add a planner and object-store round trips that thousands of small rows do not need.

The driver writes every file a run leaves (index, extraction cache, results, LM record); a worker
that dies is restarted by Ray and its batch asked again. Paths are made absolute before they travel:
workers do not start in the driver's folder, and on several nodes they must name a folder every
node sees (the index, the cache dir).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from modules.errors import HyperProveError
from pipeline.config import replay_sources
from pipeline.runtime import LIBRARY_DEFAULTS

RAY_HINT = 'Ray is an optional extra: pip install -e ".[ray]"'
RESTARTS = 3  # times Ray restarts a worker that died, and asks its batch again


def ray_module():
    try:
        import ray
    except ImportError:
        raise HyperProveError(f"--ray needs Ray, which is not installed; {RAY_HINT}") from None
    return ray


def connect(address: str) -> None:
    """Join the Ray cluster at `address` ("auto", "HOST:PORT", "ray://HOST:PORT"), or start one in
    this process ("local"). The workers run with our library settings (offline, no network at
    import), whatever environment the cluster was started in."""

    ray = ray_module()
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": dict(LIBRARY_DEFAULTS)}
    try:
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
        else:
            ray.init(address=address, log_to_driver=False, runtime_env=runtime_env)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise HyperProveError(f"--ray {address}: could not join the Ray cluster ({error}); start one with `ray start --head` "
                              "or pass --ray local; a cluster that wants a token (Ray logs InvalidAuthToken) needs RAY_AUTH_MODE=token "
                              "and its token in ~/.ray/auth_token") from None
    except Exception as error:  # Ray raises a bare Exception when a node it starts misses a start-up deadline
        raise HyperProveError(f"--ray {address}: Ray did not come up ({error}); on a busy machine its agents can miss Ray's "
                              "start-up deadlines (raylet.out in Ray's session logs says which): try again, or start a cluster with "
                              "`ray start --head` and pass --ray auto") from None


def absolute_paths(config):
    """The config with every path absolute."""
    def resolved(path: str | None) -> str | None:
        return str(Path(path).expanduser().resolve()) if path else path

    run, lm, program = config.evaluation, config.lm, config.program
    return config.with_overrides(
        evaluation={"questions": resolved(run.questions), "corpus": resolved(run.corpus), "index": resolved(run.index)},
        lm={"replay": lm.replay and ",".join(resolved(source) for source in replay_sources(lm.replay)),
            "local_model_dir": resolved(lm.local_model_dir)},
        program={"compiled": resolved(program.compiled)},
        cache_dir=resolved(config.cache_dir),
    )


class WorkerPool:
    """`workers` Ray actors of `worker_class`, the n-th built as `worker_class(config_n, *args)` with
    config_n the config at the n-th LM endpoint (round robin over `lm.api_base`'s list)."""

    def __init__(self, config, worker_class: type, *args):
        ray = ray_module()
        from ray.util import ActorPool

        connect(config.cluster.ray)
        config = absolute_paths(config)
        cpus = float(ray.cluster_resources().get("CPU", 1))
        self.workers = config.cluster.workers or max(int(cpus), 1)
        self.endpoints = config.lm.endpoints
        share = min(1.0, cpus / self.workers)  # LM-bound workers wait on their endpoint: several may share a CPU
        remote = ray.remote(worker_class).options(num_cpus=share, max_restarts=RESTARTS, max_task_retries=RESTARTS)
        actors = []
        for number in range(self.workers):
            at = config.with_overrides(lm={"api_base": self.endpoints[number % len(self.endpoints)]}) if self.endpoints else config
            actors.append(remote.remote(at.to_dict(), *args))
        self.pool = ActorPool(actors)
        self.actors = actors

    def wait_ready(self) -> float:
        """Block until every worker is built (imports, index, LM session); the seconds it took."""

        ray = ray_module()
        started = time.perf_counter()
        ray.get([actor.__ray_ready__.remote() for actor in self.actors])
        return time.perf_counter() - started

    def describe(self) -> str:
        where = f"{len(self.endpoints)} LM endpoint{'s' * (len(self.endpoints) > 1)}" if self.endpoints else "an embedded model each"
        return f"{self.workers} Ray workers, {where}"

    def stream(self, ask: Callable[[Any, Any], Any], batches: Iterable, what: str) -> Iterator:
        """Each batch's result as it finishes (`ask(actor, batch)` starts a batch on an actor). A
        worker's own exception (an LM gone) is raised here as it would be in one process."""
        from ray.exceptions import RayError, RayTaskError

        try:
            yield from self.pool.map_unordered(ask, list(batches))
        except RayTaskError as error:
            raise error.cause from None
        except RayError as error:
            raise HyperProveError(f"{what}: a Ray worker failed past {RESTARTS} restarts ({type(error).__name__}: "
                                  f"{str(error).splitlines()[0][:200]}); what was finished is kept, so the same command resumes") from None

    def close(self) -> None:
        """Let the workers go (the cluster stays)."""
        ray = ray_module()
        while (actor := self.pool.pop_idle()) is not None:
            ray.kill(actor)


def batches(items: list, size: int) -> list[list]:
    return [items[start:start + size] for start in range(0, len(items), size)]
