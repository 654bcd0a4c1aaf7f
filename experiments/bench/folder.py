"""A real folder of documents in three formats, indexed in one command: npm's documentation as the
installed npm ships it, and two PDF manuals from Debian's packages.

    python -m experiments.bench.folder --out runs/docs            # assembles runs/docs/files, indexes it into runs/docs/index
    hyperprove serve runs/docs/index                              # then ask through the page

Where the files come from (none is committed; each is read where the system put it):
- `/usr/lib/node_modules/npm/docs/content/commands/*.md`: npm's command reference in Markdown
  (npm, Inc. and contributors, the Artistic License 2.0; Debian's `nodejs`/`npm` package);
- `/usr/lib/node_modules/npm/docs/output/{using-npm,configuring-npm}/*.html`: npm's guides as
  the HTML pages npm renders (same licence);
- `/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf` (the Shared MIME-info Database
  specification, GPL-2+) and `/usr/share/doc/libtasn1-doc/libtasn1.pdf` (the GNU Libtasn1
  manual, GFDL-1.3), from Debian's `shared-mime-info` and `libtasn1-doc` packages.
It copies them under `OUT/files` (keeping npm's folders), runs `hyperprove index OUT/files --out
OUT/index` and prints the files, passages and seconds that command reported.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NPM_DOCS = Path("/usr/lib/node_modules/npm/docs")
PDFS = [Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf"), Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf")]


def sources() -> dict[str, list[Path]]:
    return {"npm/commands": sorted((NPM_DOCS / "content" / "commands").glob("*.md")),
            "npm/using-npm": sorted((NPM_DOCS / "output" / "using-npm").glob("*.html")),
            "npm/configuring-npm": sorted((NPM_DOCS / "output" / "configuring-npm").glob("*.html")),
            "manuals": [path for path in PDFS if path.is_file()]}


def assemble(files: Path) -> dict[str, int]:
    """Copy the documents under `files`; how many of each suffix."""
    if files.exists():
        shutil.rmtree(files)
    for name, found in sources().items():
        if not found:
            raise SystemExit(f"error: nothing found for {name}: this script reads the documentation that Debian's nodejs, "
                             "shared-mime-info and libtasn1-doc packages install")
        (files / name).mkdir(parents=True)
        for path in found:
            shutil.copy2(path, files / name / path.name)
    counts: dict[str, int] = {}
    for path in files.rglob("*"):
        if path.is_file():
            counts[path.suffix] = counts.get(path.suffix, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/docs", help="where the folder (files/) and its index (index/) go")
    parser.add_argument("--extractor", default="sentences")
    args = parser.parse_args(argv)
    out = Path(args.out)
    counts = assemble(out / "files")
    print(f"{sum(counts.values())} files: " + ", ".join(f"{n} {suffix}" for suffix, n in sorted(counts.items())), flush=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "index", str(out / "files"), "--out", str(out / "index"),
                           "--extractor", args.extractor, "--json"], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
        return 1
    for line in done.stdout.splitlines()[:-1]:
        if "skipped" in line or "files," in line:
            print(line)
    built = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"hyperprove index: {built['files']} files, {built['skipped']} skipped, {built['passages']} passages, {built['facts']} facts, "
          f"{built['entities']} entities; {built['seconds']:.0f} s building, {seconds:.0f} s for the whole command")
    return 0


if __name__ == "__main__":
    sys.exit(main())
