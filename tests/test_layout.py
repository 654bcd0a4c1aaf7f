"""The house rules a newcomer relies on: what each folder may import, and the public face."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.tools import house

ROOT = Path(__file__).resolve().parents[1]


def test_no_folder_imports_one_above_it_and_no_module_imports_in_a_circle():
    graph = house.import_graph()
    assert "pipeline.index.build" in graph and "pipeline.lm.session" in graph["pipeline.runtime"]
    assert house.upward(graph) == []
    assert house.circles(graph) == []


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_rules_see_imports_inside_functions_relative_imports_and_circles(tmp_path):
    write_tree(tmp_path, {
        "modules/__init__.py": "", "modules/a.py": "import os\n\ndef f():\n    from optimize.x import run\n",
        "modules/b.py": "from . import c\n", "modules/c.py": "from modules.b import thing\n",
        "pipeline/__init__.py": "", "pipeline/cli.py": "import optimize.x\n", "pipeline/lm/__init__.py": "",
        "pipeline/lm/s.py": "from ..cli import main\nimport experiments.data\n",
        "optimize/__init__.py": "", "optimize/x.py": "from modules import a\n", "experiments/__init__.py": "",
        "experiments/data.py": "",
    })
    graph = house.import_graph(tmp_path)
    assert graph["modules.a"] == {"optimize.x"} and graph["pipeline.lm.s"] == {"pipeline.cli", "experiments.data"}
    # the command line may reach every folder; nothing else goes up a layer
    assert house.upward(graph) == [("modules.a", "optimize.x"), ("pipeline.lm.s", "experiments.data")]
    assert house.circles(graph) == [["modules.a", "optimize.x"], ["modules.b", "modules.c"]]


def test_the_public_face_names_what_a_user_needs_and_loads_nothing_heavy():
    code = ("import sys, pipeline; print(','.join(pipeline.__all__)); "
            "print(any(m in sys.modules for m in ('dspy', 'faiss', 'torch', 'mlflow')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False"
    names = out[0].split(",")
    assert {"HyperProveConfig", "Runtime", "load_corpus", "build_index", "load_index", "grow_index", "shrink_index",
            "HyperProve", "HypergraphRetriever", "ask", "HyperProveError"} <= set(names)
    import pipeline
    from pipeline.index.build import build_index
    from pipeline.program import HyperProve

    assert pipeline.build_index is build_index and pipeline.HyperProve is HyperProve
    assert all(getattr(pipeline, name) is not None for name in names)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        pipeline.nothing  # noqa: B018


def test_a_python_api_runtime_sets_the_offline_defaults_the_command_line_sets():
    code = ("import os\nfrom pipeline import HyperProveConfig, Runtime\nRuntime(HyperProveConfig())\n"
            "print(os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP'), os.environ.get('HF_HUB_OFFLINE'))")
    env = {k: v for k, v in os.environ.items() if k not in ("LITELLM_LOCAL_MODEL_COST_MAP", "HF_HUB_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, env=env).stdout.split()
    assert out == ["True", "1"]
