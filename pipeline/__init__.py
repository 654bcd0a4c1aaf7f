"""HyperProve's public face: the names a user of the Python API needs, from one import.

    from pipeline import HyperProveConfig, Runtime, load_corpus, build_index, HyperProve

Each name is imported on first use (PEP 562), so `import pipeline` (and the command line's
`--help`) loads neither DSPy nor FAISS nor torch until a name that needs them is asked for.
"""

from __future__ import annotations

import importlib

_WHERE = {  # name -> the module that defines it
    "HyperProveConfig": "pipeline.config",
    "IndexConfig": "pipeline.config",
    "LMConfig": "pipeline.config",
    "ProgramConfig": "pipeline.config",
    "RetrieverConfig": "modules.config",
    "HyperProveError": "modules.errors",
    "Runtime": "pipeline.runtime",
    "load_corpus": "pipeline.index.corpus",
    "read_folder": "pipeline.index.documents",
    "index_corpus": "pipeline.index.commands",
    "build_index": "pipeline.index.build",
    "save_index": "pipeline.index.store",
    "load_index": "pipeline.index.store",
    "grow_index": "pipeline.index.changes",
    "shrink_index": "pipeline.index.changes",
    "HypergraphIndex": "pipeline.index.build",
    "HypergraphRetriever": "modules.retrieval.retriever",
    "HyperProve": "pipeline.program",
    "ask": "pipeline.serve.ask",
    "Asker": "pipeline.serve.ask",
    "make_app": "pipeline.serve.server",
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # found once, then an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
