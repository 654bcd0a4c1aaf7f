"""The shape of the code, in figures: files and lines per folder, the largest file, import circles,
imports that go up a layer, and what git tracks.

    python -m experiments.tools.house [--json]

Layers go one way: modules < pipeline < experiments < optimize; only the command line
(`pipeline/cli.py`, the shell over every folder) may import upward. Imports inside functions count.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("modules", "pipeline", "experiments", "optimize")
SHELL = "pipeline.cli"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(path for layer in LAYERS for path in (root / layer).rglob("*.py") if "results" not in path.parts)


def imports(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The project modules a file imports (at the top or inside a function), each the longest known name."""
    package = module_name(path, root).split(".") if path.name == "__init__.py" else module_name(path, root).split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                if ".".join(parts[:end]) in known:
                    found.add(".".join(parts[:end]))
                    break
    return found - {module_name(path, root)}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = source_files(root)
    known = {module_name(path, root) for path in files}
    return {module_name(path, root): imports(path, known, root) - set(LAYERS) for path in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    rank = {layer: n for n, layer in enumerate(LAYERS)}
    return sorted((source, target) for source, targets in graph.items() if source != SHELL
                  for target in targets if rank[target.split(".")[0]] > rank[source.split(".")[0]])


def tracked(root: Path = ROOT) -> tuple[int, int]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout.split(b"\0")
    paths = [root / name.decode() for name in names if name]
    return len(paths), sum(path.stat().st_size for path in paths if path.is_file())


def figures(root: Path = ROOT) -> dict:
    files = source_files(root)
    lines = {str(path.relative_to(root)): len(path.read_text().splitlines()) for path in files}
    per_folder = Counter(str(Path(name).parent) for name in lines)
    largest = max(lines, key=lines.get)
    graph = import_graph(root)
    count, size = tracked(root)
    return {"files_per_folder": dict(sorted(per_folder.items())), "largest_file": [largest, lines[largest]],
            "import_circles": circles(graph), "upward_imports": [list(pair) for pair in upward(graph)],
            "imports_inside_functions": inner_imports(files), "tracked_files": count, "tracked_mb": round(size / 1e6, 1)}


def inner_imports(files: list[Path]) -> int:
    """Import statements inside a function or method body."""
    inner = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner |= {(str(path), statement.lineno) for statement in ast.walk(node)
                          if isinstance(statement, (ast.Import, ast.ImportFrom))}
    return len(inner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    shape = figures()
    if args.json:
        print(json.dumps(shape))
        return 0
    print("files per folder: " + ", ".join(f"{folder} {n}" for folder, n in shape["files_per_folder"].items()))
    print("largest file: {} ({} lines)".format(*shape["largest_file"]))
    print(f"import circles: {len(shape['import_circles'])} {shape['import_circles'] or ''}".rstrip())
    print(f"upward imports outside the command line: {len(shape['upward_imports'])} {shape['upward_imports'] or ''}".rstrip())
    print(f"imports inside functions: {shape['imports_inside_functions']}")
    print(f"tracked: {shape['tracked_files']} files, {shape['tracked_mb']} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
