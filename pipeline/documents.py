"""A folder of documents as a corpus: text, Markdown, HTML, PDF and JSON/JSONL corpus files, read
recursively and split into passages the way the retriever likes them.

A document becomes sections (a Markdown heading, an HTML heading, a PDF page); a section is split
into passages at paragraph boundaries within a word budget, a paragraph longer than the budget at
sentence boundaries, with a few words of overlap where a cut falls inside a paragraph (so a fact
stated across the cut is whole in one passage). Each passage is titled by its document and
section, and carries its source, `file#chunk` (the file's path and the passage's place in it);
reading a changed folder again replaces only the passages whose text changed, and the others
keep their ids (`pipeline.index_commands.folder_update`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Collection, Iterator

from modules.errors import HyperProveError
from modules.facts import Passage

DOCS_HINT = 'pip install -e ".[docs]"'


SECTION_MARK = " › "  # between a document's title and a section's heading in a passage title


class MissingExtra(HyperProveError):
    """A format library that is not installed: the whole run stops, naming the extra."""


@dataclass(frozen=True)
class Section:
    heading: str  # "" for a document's text before its first heading
    text: str  # paragraphs separated by blank lines


@dataclass
class Document:
    path: str  # relative to the folder, with "/" between parts
    title: str
    sections: list[Section]
    sha256: str
    passages: list[Passage] | None = None  # a JSON/JSONL corpus file: its passages, as they are


@dataclass
class FolderCorpus:
    """What `read_folder` took: passages in file order, each file's checksum, what it skipped."""

    root: Path
    passages: list[Passage]
    files: dict[str, str]  # relative path -> sha256 of its bytes
    skipped: list[str] = field(default_factory=list)  # one line each: "path: why"
    other_kinds: dict[str, int] = field(default_factory=dict)  # suffix -> files not read

    def summary(self) -> str:
        others = ", ".join(f"{n} {suffix or 'without a suffix'}" for suffix, n in sorted(self.other_kinds.items()))
        return (f"{self.root}: {len(self.files)} files, {len(self.passages)} passages"
                + (f"; {len(self.skipped)} skipped (unreadable, empty or repeated)" if self.skipped else "")
                + (f"; not documents, left alone: {others}" if others else ""))


# ---------------------------------------------------------------- splitting


SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])")  # the space after a sentence's end


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each with its whitespace closed up."""
    return [" ".join(block.split()) for block in re.split(r"\n\s*\n", text) if block.strip()]


ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "prof.", "gen.", "col.", "lt.", "vs.", "no.", "b.", "d.", "c.",
                 "ca.", "e.g.", "i.e.", "etc.", "approx.", "fig.", "vol.", "pp.", "inc.", "ltd.", "co."}


def sentences(paragraph: str) -> list[str]:
    """Sentences, not cut after an abbreviation ("Mr.", "b.") or an initial ("J.")."""
    found: list[str] = []
    for piece in SENTENCE_END.split(paragraph):
        if found and ((last := found[-1].rsplit(" ", 1)[-1].lstrip("(\"'[")).lower() in ABBREVIATIONS or re.fullmatch(r"\(?[A-Z]\.", last)):
            found[-1] += " " + piece
        elif piece.strip():
            found.append(piece)
    return found


def _pieces(paragraph: str, max_words: int) -> list[list[str]]:
    """A paragraph over the budget as sentences (as word lists), a sentence over it cut in windows."""
    pieces = []
    for sentence in sentences(paragraph):
        words = sentence.split()
        pieces += [words[start:start + max_words] for start in range(0, len(words), max_words)]
    return pieces


def split_text(text: str, max_words: int = 120, overlap: int = 20) -> list[str]:
    """Passages of at most `max_words` words: whole paragraphs packed together while they fit; a
    longer paragraph in sentence runs, each later run starting with the last sentences (at most
    `overlap` words) of the run before it. Paragraphs that fit are never cut or repeated."""
    chunks: list[str] = []
    current: list[str] = []  # words of the passage being packed

    def emit() -> None:
        if current:
            chunks.append(" ".join(current))
            current.clear()

    for paragraph in paragraphs(text):
        words = paragraph.split()
        if len(words) <= max_words:
            if len(current) + len(words) > max_words:
                emit()
            current += words
            continue
        emit()
        carried: list[list[str]] = []  # the sentences the next run repeats
        for piece in _pieces(paragraph, max_words):
            if len(current) + len(piece) > max_words:
                emit()
                current += [w for sentence in carried for w in sentence]
                if len(current) + len(piece) > max_words:  # the overlap and the piece do not fit together
                    current.clear()
            current += piece
            carried = (carried + [piece]) if len(piece) <= overlap else []
            while carried and sum(map(len, carried)) > overlap:
                carried.pop(0)
        emit()
    emit()
    return chunks


def document_passages(document: Document, max_words: int, overlap: int) -> list[Passage]:
    """The document's passages, titled "<title> › <section>" (the title alone before any heading),
    with sources "<path>#0", "<path>#1", ...."""
    if document.passages is not None:
        texts = [(p.title, p.text) for p in document.passages]
    else:
        texts = [(SECTION_MARK.join(filter(None, [document.title, section.heading])), chunk)
                 for section in document.sections for chunk in split_text(section.text, max_words, overlap)]
    return [Passage(title=title, text=text, source=f"{document.path}#{k}") for k, (title, text) in enumerate(texts)]


# ---------------------------------------------------------------- readers


def humanised(stem: str) -> str:
    """"alan_turing-biography" -> "alan turing biography": a file name as a title."""
    return " ".join(re.split(r"[_\-\s]+", stem)).strip() or stem


def decoded(data: bytes) -> str:
    """UTF-8 (a byte-order mark dropped), else Latin-1; bytes with NULs are no text at all."""
    if b"\x00" in data[:8192]:
        raise ValueError("binary data, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def read_plain(path: Path, data: bytes) -> tuple[str, list[Section]]:
    """A first line that stands alone and reads as a heading (short, no full stop) titles the
    text; else the file's name does."""
    text = decoded(data)
    first, _, rest = text.strip().partition("\n")
    if rest.startswith("\n") or not rest.strip():
        if 0 < len(first.split()) <= 12 and not first.rstrip().endswith((".", ",", ";", ":")) and rest.strip():
            return first.strip(), [Section("", rest)]
    return humanised(path.stem), [Section("", text)]


MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
MD_MARKUP = re.compile(r"(\*\*|__|\*|`+|~~|<[^>]+>)")
SETEXT = re.compile(r"\s*(=+|-{2,})\s*")
LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def read_markdown(path: Path, data: bytes) -> tuple[str, list[Section]]:
    """Headings start sections (nested headings joined, the first level-1 heading is the title);
    links keep their text, emphasis and inline HTML lose their marks; front matter is skipped."""
    lines = decoded(data).splitlines()
    title = None
    if lines and lines[0].strip() == "---" and "---" in (stripped := [line.strip() for line in lines[1:]]):
        end = stripped.index("---") + 1
        for line in lines[1:end]:
            if line.lower().startswith("title:"):
                title = line.split(":", 1)[1].strip().strip("\"'") or None
        lines = lines[end + 1:]
    sections: list[Section] = []
    trail: list[tuple[int, str]] = []  # the headings above the current line
    body: list[str] = []
    fenced = False

    def close() -> None:
        if "".join(body).strip():
            sections.append(Section(SECTION_MARK.join(text for _, text in trail), "\n".join(body)))
        body.clear()

    number = 0
    while number < len(lines):
        line, number = lines[number], number + 1
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            body.append(line)
            continue
        level = text = None
        if heading := MD_HEADING.match(line):
            level, text = len(heading[1]), heading[2]
        elif (line.strip() and number < len(lines) and SETEXT.fullmatch(lines[number])
              and (number == 1 or not lines[number - 2].strip())):
            level, text, number = (1 if "=" in lines[number] else 2), line, number + 1
        if level is None:
            body.append(markdown_line(line))
            continue
        close()
        text = markdown_line(text)
        if level == 1 and title is None and not sections:
            title = text
        else:
            trail = [(lvl, t) for lvl, t in trail if lvl < level] + [(level, text)]
    close()
    return title or humanised(path.stem), sections


def markdown_line(line: str) -> str:
    """A line of Markdown as text: a list item's mark, emphasis, code and inline HTML marks gone,
    a link's text kept."""
    return MD_MARKUP.sub("", MD_LINK.sub(r"\1", LIST_MARK.sub("", line))).strip()


HTML_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
HTML_BLOCKS = {"p", "div", "section", "article", "main", "li", "ul", "ol", "dl", "dt", "dd", "table", "tr", "td", "th", "pre",
               "blockquote", "figure", "figcaption", "br", "hr", "address", "details", "summary"}
LINK_DENSITY = 0.8  # a paragraph with at least this share of its words in links is navigation
HTML_NOISE = ["head", "title", "script", "style", "noscript", "nav", "header", "footer", "aside", "form", "template", "svg", "button", "iframe"]


def read_html(path: Path, data: bytes) -> tuple[str, list[Section]]:
    """The main text (`<main>`, else `<article>`, else `<body>`) without scripts, navigation,
    headers and footers, a paragraph per block element; `<h1>`-`<h6>` start sections, the page's
    `<title>` (or first `<h1>`) titles it."""
    bs4 = _optional("bs4", "HTML")
    soup = bs4.BeautifulSoup(data, "html.parser")
    title = " ".join(soup.title.get_text(" ").split()) if soup.title else ""
    for noise in soup.find_all(HTML_NOISE):
        noise.decompose()
    sections: list[Section] = []
    heading, body, words = "", [], []  # words: (text, inside a link)

    def paragraph() -> None:
        """The words read since the last block as a paragraph, unless nearly all are link text
        (a menu, a table of contents, a list of links: navigation, not content)."""
        text = re.sub(r"\s+([.,;:!?%)\]])", r"\1", " ".join(" ".join(t for t, _ in words).split()))
        linked = sum(len(t.split()) for t, in_link in words if in_link)
        if text and linked < LINK_DENSITY * len(text.split()):
            body.append(text)
        words.clear()

    def walk(node, in_link: bool = False) -> None:
        nonlocal heading, title
        for child in node.children:
            if isinstance(child, bs4.NavigableString):
                if type(child) is bs4.NavigableString:  # not a comment, doctype or CDATA
                    words.append((str(child), in_link))
            elif child.name in HTML_HEADINGS:
                paragraph()
                if body:
                    sections.append(Section(heading, "\n\n".join(body)))
                    body.clear()
                text = " ".join(child.get_text(" ").split())
                if child.name == "h1" and not title:
                    title = text
                elif text and not (child.name == "h1" and text == title):
                    heading = text
            elif child.name in HTML_BLOCKS:
                paragraph()
                walk(child, in_link)
                paragraph()
            else:
                walk(child, in_link or child.name == "a")

    walk(soup.find("main") or soup.find("article") or soup.body or soup)
    paragraph()
    if body:
        sections.append(Section(heading, "\n\n".join(body)))
    return title or humanised(path.stem), sections


def read_pdf(path: Path, data: bytes) -> tuple[str, list[Section]]:
    """One section a page ("p. 3"); lines joined into paragraphs, words hyphenated across a line
    break joined again. The title is the PDF's own when it has one."""
    import io

    pypdf = _optional("pypdf", "PDF")
    reader = pypdf.PdfReader(io.BytesIO(data))
    title = ((reader.metadata.title if reader.metadata else None) or "").strip()
    sections = []
    for number, page in enumerate(reader.pages, start=1):
        text = page.extract_text() or ""
        text = re.sub(r"(\w)-\n(\w)", r"\1\2", text)
        text = re.sub(r"(?<!\n)\n(?!\n)", " ", text)
        if text.strip():
            sections.append(Section(f"p. {number}", text))
    return title or humanised(path.stem), sections


def read_corpus_file(path: Path, data: bytes) -> list[Passage]:
    """Today's corpus files: a JSON list of {"title", "text"}, or JSON lines of them."""
    from pipeline.corpus import corpus_passage

    if path.suffix.lower() == ".jsonl":
        items = [json.loads(line) for line in decoded(data).splitlines() if line.strip()]
    else:
        items = json.loads(decoded(data))
        if not isinstance(items, list):
            raise ValueError(f"a corpus file holds a JSON list, found {type(items).__name__}")
    return [corpus_passage(path, k, item) for k, item in enumerate(items)]


READERS: dict[str, Callable[[Path, bytes], tuple[str, list[Section]]]] = {
    ".txt": read_plain, ".text": read_plain, ".md": read_markdown, ".markdown": read_markdown,
    ".html": read_html, ".htm": read_html, ".pdf": read_pdf,
}
CORPUS_SUFFIXES = (".json", ".jsonl")


def _optional(module: str, kind: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"reading {kind} files needs the {module} package: {DOCS_HINT}") from None


def read_document(path: Path, relative: str) -> Document:
    """One file as a `Document`; ValueError (with the reason) when it cannot be read as its kind."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    suffix = path.suffix.lower()
    try:
        if suffix in CORPUS_SUFFIXES:
            return Document(relative, humanised(path.stem), [], digest, passages=read_corpus_file(path, data))
        title, sections = READERS[suffix](path, data)
    except MissingExtra:
        raise
    except HyperProveError as error:  # a corpus file's field check, which names the file itself
        raise ValueError(str(error).removeprefix(f"{path}: ")) from None
    except (ValueError, RecursionError) as error:
        raise ValueError(str(error) or type(error).__name__) from None
    except Exception as error:  # a format library's own failure on a damaged file is that file's problem only
        raise ValueError(f"{type(error).__name__}: {error}") from None
    return Document(relative, " ".join(title.split()), [s for s in sections if s.text.strip()], digest)


def is_index(folder: Path) -> bool:
    """A HyperProve index (say one written inside the folder it was built from): not documents."""
    try:
        return json.loads((folder / "manifest.json").read_text(encoding="utf-8")).get("format") == "hyperprove-index"
    except (OSError, ValueError, AttributeError):
        return False


def document_files(folder: Path) -> Iterator[tuple[Path, str]]:
    """Every file under `folder` (hidden files and folders, and HyperProve indexes, left out), in
    path order, with its path relative to `folder`."""
    indexes = {path.parent for path in folder.rglob("manifest.json") if is_index(path.parent)}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file() or indexes.intersection(path.parents):
            continue
        yield path, PurePosixPath(relative).as_posix()


def read_folder(folder: str | Path, max_words: int = 120, overlap: int = 20, log: Callable[[str], None] = print,
                prefix: str = "", leave_out: Collection[str] = ()) -> FolderCorpus:
    """Every document under `folder` as passages, its path `prefix` + its path in `folder`, but
    for those `leave_out` names. An unreadable or empty file is reported (one line) and skipped;
    a passage that repeats an earlier one word for word is kept once."""
    root = Path(folder)
    if not root.is_dir():
        raise HyperProveError(f"{root}: not a folder")
    corpus = FolderCorpus(root=root, passages=[], files={})
    taken: set[Passage] = set()
    for path, relative in document_files(root):
        relative = prefix + relative
        if relative in leave_out:
            continue
        suffix = path.suffix.lower()
        if suffix not in READERS and suffix not in CORPUS_SUFFIXES:
            corpus.other_kinds[suffix] = corpus.other_kinds.get(suffix, 0) + 1
            continue
        try:
            document = read_document(path, relative)
        except OSError as error:
            problem = f"cannot read it ({error.strerror or error})"
        except ValueError as error:
            problem = f"not a readable {suffix[1:].upper()} file ({error})"
        else:
            every = document_passages(document, max_words, overlap)
            passages = [p for p in every if not (p in taken or taken.add(p))]
            if passages:
                corpus.passages += passages
                corpus.files[relative] = document.sha256
                continue
            problem = "every passage repeats an earlier file's" if every else "no text"
        line = f"{path}: skipped: {problem}"
        corpus.skipped.append(line)
        log(line)
    if not corpus.passages:
        raise HyperProveError(f"{root}: no document with text in it" + (f" ({len(corpus.skipped)} skipped)" if corpus.skipped else ""))
    return corpus


def file_of(source: str | None) -> str | None:
    """"docs/a.md#3" -> "docs/a.md"."""
    return source.rpartition("#")[0] if source else None
