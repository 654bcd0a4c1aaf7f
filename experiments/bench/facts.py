"""What the `sentences` extractor makes of a folder of documents, rule set by rule set: how many facts
are fragments, how much of each page's main text the passages keep, and how much page furniture
gets in.

    python -m experiments.bench.facts                                  # the Edition Guide, and the Cargo Book where rustup has it
    python -m experiments.bench.facts --folders my-docs/ --rules 1 2

Per folder and rule set (`index.sentence_rules`) it prints: passages and facts; fragments (facts
under 3 words), facts that end with ":" (an introduction parted from what it introduces, at a
passage's end), facts where a pronoun became a long document title ("Page › Section commenced
...", "… - The Rust Edition Guide’s identical"), code blocks kept whole, and the furniture of API
pages left in passages (rustdoc's "Expand description", "Copy item path", "Read more", "· Source"
and "§"). For the HTML pages:
the share of the main text (`<main>`, else `<article>`, else `<body>`, as lxml reads
it) whose words the passages and their titles keep, counted word by word, and the furniture lines (runs of 3 or
more words outside the main text: sidebars, menus, footers) found in a passage of their page.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from modules.lm.checks import FENCE
from pipeline.index.documents import SECTION_MARK, html_markup, html_strings, read_folder
from pipeline.index.extract import SentenceExtractor

ROOT = Path(__file__).resolve().parents[2]
WORD = re.compile(r"\w+")  # words without their punctuation: the readers and this bench space "x." differently
API_FURNITURE = re.compile(r"Expand description|Copy item path|Read more|· Source\b|§")  # rustdoc's toggles, links and anchors
EDITION_GUIDE = ROOT.parent / "shared" / "data" / "docs-edition-guide" / "docs"


def cargo_book() -> Path | None:
    """The Cargo Book rustup installed beside `rustup doc --path`, if there is one."""
    try:
        found = subprocess.run(["rustup", "doc", "--path"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    folder = Path(found).parent / "cargo" if found else None
    return folder if folder and folder.is_dir() else None


def page_text(path: Path) -> tuple[list[str], list[str]]:
    """An HTML page's main-text words, and its furniture lines (3 words or more outside the main text)."""
    import lxml.html

    root = lxml.html.document_fromstring(html_markup(path.read_bytes()))
    for noise in list(root.iter("script", "style", "noscript", "template", "title")):  # not <head>: lxml may put a page without <body> in it
        noise.drop_tree()
    main = next((found for tag in ("main", "article", "body") if (found := root.find(f".//{tag}")) is not None), root)
    words = WORD.findall(" ".join(html_strings(main, leave_out=())))
    if main is not root:
        main.drop_tree()
    furniture = [" ".join(line.split()) for line in "\n".join(html_strings(root, leave_out=())).split("\n") if len(line.split()) >= 3]
    return words, furniture


def measure(folder: Path, rules: int) -> dict:
    corpus = read_folder(folder, log=lambda line: None)
    passages = corpus.passages
    facts = [fact for per_passage in SentenceExtractor(rules).extract(passages) for fact in per_passage]
    title_words = {passage.title.split(SECTION_MARK)[0] for passage in passages}
    figures = {"passages": len(passages), "facts": len(facts),
               "fragments": sum(len(fact.text.split()) < 3 for fact in facts),
               "ending ':'": sum(fact.text.endswith(":") for fact in facts),
               "title as subject": sum(any(fact.text.startswith(f"{title} ›") or fact.text.startswith(f"{title}’s")
                                           for title in title_words if " " in title) for fact in facts),
               "code blocks": sum(passage.text.count(FENCE) // 2 for passage in passages),
               "API page furniture": sum(len(API_FURNITURE.findall(f"{passage.title}\n{passage.text}")) for passage in passages)}
    by_file: dict[str, dict[str, None]] = {}  # a page's passage texts, and its titles once each (headings move there)
    for passage in passages:
        by_file.setdefault(passage.source.rsplit("#", 1)[0], {}).update(dict.fromkeys([passage.title, passage.text.replace(FENCE, " ")]))
    main_words = kept = furniture = leaked = 0
    for relative, texts in by_file.items():
        if not relative.endswith((".html", ".htm")):
            continue
        words, lines = page_text(folder / relative)
        joined = " ".join(" ".join(texts).split())
        wanted, got = Counter(words), Counter(WORD.findall(joined))
        main_words += sum(wanted.values())
        kept += sum(min(n, got[word]) for word, n in wanted.items())
        furniture += len(lines)
        leaked += sum(line in joined for line in lines)
    if main_words:
        figures.update({"main text kept %": round(100 * kept / main_words, 1), "furniture lines": furniture, "furniture in passages": leaked})
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folders", nargs="*", type=Path, help="folders of documents (default: the Edition Guide and the Cargo Book)")
    parser.add_argument("--rules", nargs="*", type=int, default=[1, 2], choices=[1, 2], help="sentence rule sets to compare")
    args = parser.parse_args(argv)
    folders = args.folders or [folder for folder in (EDITION_GUIDE, cargo_book()) if folder and folder.is_dir()]
    if not folders:
        print("no folder to read: give --folders (the Edition Guide is in ../shared/data, the Cargo Book comes with rustup)", file=sys.stderr)
        return 2
    for folder in folders:
        for rules in args.rules:
            figures = measure(folder, rules)
            print(f"{folder} (sentence_rules {rules}): " + ", ".join(f"{key} {value}" for key, value in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
