"""The house rules a newcomer relies on: what each folder may import, and the public face."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("modules", "pipeline", "experiments", "optimize")
# folder -> the folders it must not import (the command line, pipeline/cli.py, is the one shell over all)
FORBIDDEN = {"modules": {"pipeline", "experiments", "optimize"}, "pipeline": {"experiments", "optimize"}, "experiments": {"optimize"}}


def imported_folders(path: Path) -> set[str]:
    """The project folders a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        found |= {name.split(".")[0] for name in names if name.split(".")[0] in FOLDERS}
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_folder_imports_one_above_it(folder):
    breaches = {str(path.relative_to(ROOT)): sorted(imported_folders(path) & FORBIDDEN[folder])
                for path in sorted((ROOT / folder).rglob("*.py")) if path.name != "cli.py" or folder != "pipeline"}
    assert {path: folders for path, folders in breaches.items() if folders} == {}


def test_the_rule_sees_imports_inside_functions(tmp_path):
    (tmp_path / "f.py").write_text("import os\n\ndef f():\n    from optimize.tracking import connect\n    import experiments.data\n")
    assert imported_folders(tmp_path / "f.py") == {"optimize", "experiments"}


def test_the_public_face_names_what_a_user_needs_and_loads_nothing_heavy():
    code = ("import sys, pipeline; print(','.join(pipeline.__all__)); "
            "print(any(m in sys.modules for m in ('dspy', 'faiss', 'torch', 'mlflow')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False"
    names = out[0].split(",")
    assert {"HyperProveConfig", "Runtime", "load_corpus", "build_index", "load_index", "grow_index", "shrink_index",
            "HyperProve", "HypergraphRetriever", "ask", "HyperProveError"} <= set(names)
    import pipeline
    from pipeline.index import build_index
    from pipeline.program import HyperProve

    assert pipeline.build_index is build_index and pipeline.HyperProve is HyperProve
    assert all(getattr(pipeline, name) is not None for name in names)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        pipeline.nothing  # noqa: B018
