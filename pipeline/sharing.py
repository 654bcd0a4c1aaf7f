"""What a config file may decide when it is not the user's own.

Experiment configs are made to be shared (one file per experiment), so a config file is read as
someone else's: it may choose how the program answers, never where requests go or what is
written outside the folder the command runs in. A setting that sends data somewhere (the LM
endpoint, which also receives the API key; a tracking server; a study database), writes
outside the working folder, or loads a model folder from disk is refused with one line naming
the field, unless the user passes `--trust-config` (the file is their own). The same settings
given as flags are the user's and are always taken. Values equal to the field's default are
not choices of the file and pass.
"""

from __future__ import annotations

from pathlib import PurePath
from urllib.parse import urlsplit

from modules.errors import HyperProveError

# field -> (what it decides, the flag that sets it instead, if any)
SENDS = {  # where requests and traces go
    "lm.api_base": ("where the LM's requests (and your API key) go", "--api-base"),
    "tracking.uri": ("where runs and traces (prompts, answers) are sent", "--tracking-uri"),
    "sweep.storage": ("which database the study is written to", "--storage"),
}
WRITES = {  # files and folders written
    "evaluation.out": ("where results are written", "--out"),
    "sweep.best_out": ("which file the best parameters are written to", "--best-out"),
    "compile.out": ("which file the compiled program is written to", "--out"),
    "tracking.artifacts": ("where run artifacts are written", None),
    "lm.local_model_dir": ("where the embedded model (1.1 GB) is written", None),
    "cache_dir": ("where caches are written", "--cache-dir"),
}
LOADS = {  # model folders loaded from disk
    "index.embedder": ("which folder on disk is loaded as the embedder model", "--embedder"),
}


def local_path(value: str) -> str | None:
    """The local path a value names (a plain path, `file:` or `sqlite:///` URL), or None when it
    names a host on a network."""
    if value.startswith("sqlite:///"):
        return value[len("sqlite:///"):]
    parts = urlsplit(value)
    if parts.scheme in ("", "file") or len(parts.scheme) == 1:  # "C:" is a drive, not a scheme
        return parts.path if parts.scheme == "file" else value
    return None


def inside_working_folder(path: str) -> bool:
    """A relative path that stays below the folder the command runs in (no "..", "~" or root)."""
    pure = PurePath(path)
    if not path or pure.is_absolute() or path.startswith("~") or ".." in pure.parts:
        return False
    return True


def why_refused(field: str, value) -> str | None:
    """Why a config that is not the user's own may not set `field` to `value` (None: it may)."""
    if not isinstance(value, str) or not value:
        return None
    if field in SENDS:
        path = local_path(value) if field != "lm.api_base" else None
        if path is None:
            return "names a host"
        return None if inside_working_folder(path) else "is a file outside the working folder"
    if field in WRITES:
        return None if inside_working_folder(value) else "is outside the working folder"
    if field in LOADS:
        return "names a folder on disk" if ("/" in value or "\\" in value or value.startswith((".", "~"))) else None
    return None


def check_shared(values: dict, defaults: dict, source: str) -> None:
    """Refuse, with one line, the first setting of `values` (a config file's JSON) that a file not
    the user's own may not make (`SENDS`, `WRITES`, `LOADS`); `defaults` is the default config as
    a dict, whose values pass."""
    for field, (decides, flag) in {**SENDS, **WRITES, **LOADS}.items():
        section, _, name = field.rpartition(".")
        held = values.get(section, {}) if section else values
        if not isinstance(held, dict) or name not in held:
            continue
        value, default = held[name], (defaults.get(section, {}) if section else defaults).get(name)
        if value == default or (reason := why_refused(field, value)) is None:
            continue
        instead = f"give {flag} yourself, or pass" if flag else "pass"
        raise HyperProveError(f"{source}: {field} = {value!r} {reason}: it decides {decides}, which a shared config may not; "
                              f"{instead} --trust-config if this file is your own")
