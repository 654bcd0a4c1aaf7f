"""The evidence-chain pages as a person sees them: open them in headless Chromium, save
screenshots, and check the DOM Chromium rendered (not part of `make test`: it needs a browser).

    apt-get install chromium                      # Debian's package
    hyperprove pages experiments/results/musique-lm60             # the pages are generated, not kept in git
    python -m experiments.bench.check_pages experiments/results/musique-lm60 --out runs/page-check

It opens the index of the `hyperprove` system and two of its question pages (the first wrong
answer and the first right one in the index's order) from disk, with the network off, and checks
that the rendered index lists every question with a link that resolves to a file, and that each
question page shows one section per hop of predictions.json, one row per fact of each hop, the
hop answers, and a gold mark for each gold passage the chain reached. Exits 1 on the first
mismatch, naming it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from pipeline.files import read_json
from pipeline.serve.pages import page_name

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


class Rendered(HTMLParser):
    """The rendered DOM: element ids, links, all text, and the text of each class."""

    def __init__(self, html: str):
        super().__init__()
        self.ids, self.links, self.text, self.classes, self._open = [], [], [], {}, []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "a":
            self.links.append(attrs.get("href"))
        if tag not in ("br", "meta", "img", "input", "link"):
            self._open.append(attrs.get("class") or "")

    def handle_endtag(self, tag):
        if self._open and tag not in ("br", "meta", "img", "input", "link"):
            self._open.pop()

    def handle_data(self, data):
        self.text.append(data)
        for name in " ".join(self._open).split():
            self.classes.setdefault(name, []).append(data.strip())


def browser() -> str:
    found = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if not found:
        raise SystemExit("error: no Chromium found; install Debian's package with `apt-get install chromium`")
    return found


def render(chrome: str, page: Path, screenshot: Path) -> Rendered:
    """Chromium's DOM of a page opened from disk, and a screenshot of it."""
    common = [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files", "--proxy-server=127.0.0.1:9",
              "--window-size=1280,1600"]
    subprocess.run([*common, f"--screenshot={screenshot}", page.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    dom = subprocess.run([*common, "--dump-dom", page.resolve().as_uri()], check=True, capture_output=True, text=True, timeout=120)
    return Rendered(dom.stdout)


def check_question(rendered: Rendered, row: dict, gold: set[int]) -> list[str]:
    """What a question page must show of its prediction row; the problems found."""
    problems = []
    hops = [i for i in rendered.ids if i.startswith("hop-") and "fact" not in i]
    if len(hops) != len(row["chain"]):
        problems.append(f"{len(hops)} hop sections for {len(row['chain'])} hops")
    facts = [i for i in rendered.ids if "fact-" in i]
    if len(facts) != sum(len(hop["facts"]) for hop in row["chain"]):
        problems.append(f"{len(facts)} fact rows for {sum(len(hop['facts']) for hop in row['chain'])} facts")
    if rendered.classes.get("hop-answer", []) != [hop["answer"] for hop in row["chain"]]:
        problems.append(f"hop answers {rendered.classes.get('hop-answer')} instead of {[hop['answer'] for hop in row['chain']]}")
    marked = sum(text == "gold passage" for text in rendered.classes.get("gold", []))
    expected = sum(fact["passage"] in gold for hop in row["chain"] for fact in hop["facts"]) + sum(p in gold for p in row["passages"][:5])
    if marked != expected:
        problems.append(f"{marked} gold marks for {expected} facts and passages from gold passages")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results folder of an LM evaluation (with pages/)")
    parser.add_argument("--out", default="runs/page-check", help="where the screenshots go")
    parser.add_argument("--system", default="hyperprove")
    args = parser.parse_args(argv)
    results, out = Path(args.results), Path(args.out)
    pages = results / "pages" / args.system
    if not (pages / "index.html").is_file():
        print(f"error: {pages / 'index.html'}: no pages; write them with `hyperprove pages {results}`", file=sys.stderr)
        return 2
    rows = {row["id"]: row for row in read_json(results / "predictions.json", "predictions")[args.system]}
    header = read_json(results / "results.json", "results")
    golds = {str(item["id"]): set(item.get("gold_passages", [])) for item in read_json(ROOT / header["questions"], "questions")}
    out.mkdir(parents=True, exist_ok=True)
    chrome = browser()

    index = render(chrome, pages / "index.html", out / "index.png")
    listed = [link for link in index.links if link.endswith(".html") and not link.startswith("..")]
    problems = [] if sorted(listed) == sorted(page_name(i) for i in rows) else [f"the index links {len(listed)} pages for {len(rows)} questions"]
    problems += [f"the index links {link}, which is not a file" for link in listed if not (pages / link).is_file()]
    by_page = {page_name(i): i for i in rows}
    wrong = next((link for link in listed if rows[by_page[link]]["em"] < 1), None)
    right = next((link for link in listed if rows[by_page[link]]["em"] >= 1), None)
    for link in [link for link in (wrong, right) if link]:
        question = by_page[link]
        rendered = render(chrome, pages / link, out / link.replace(".html", ".png"))
        problems += [f"{link}: {problem}" for problem in check_question(rendered, rows[question], golds.get(question, set()))]
        print(f"{link}: {len(rows[question]['chain'])} hops, screenshot {out / link.replace('.html', '.png')}")
    print(f"index: {len(listed)} questions linked, screenshot {out / 'index.png'}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
