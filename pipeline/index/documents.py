"""A folder of documents as a corpus: text, Markdown, HTML, PDF and JSON/JSONL corpus files, read
recursively and split into passages the way the retriever likes them.

A document becomes sections (a Markdown heading, an HTML heading, a PDF page); a section is split
into passages at paragraph boundaries within a word budget, a paragraph longer than the budget at
sentence boundaries, with a few words of overlap where a cut falls inside a paragraph (so a fact
stated across the cut is whole in one passage). Each passage is titled by its document and
section, and carries its source, `file#chunk` (the file's path and the passage's place in it);
reading a changed folder again replaces only the passages whose text changed, and the others
keep their ids (`pipeline.index.commands.folder_update`).
"""

from __future__ import annotations

import codecs
import hashlib
import importlib
import importlib.metadata
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Collection, Iterable, Iterator

from modules.errors import HyperProveError
from modules.facts import Passage
from modules.lm.checks import FENCE, text_blocks  # how a code block is kept in a passage's text, for the fact extractor
from pipeline.index.corpus import corpus_passage

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
                + (f"; {len(self.skipped)} left out (each named above)" if self.skipped else "")
                + (f"; not documents, left alone: {others}" if others else ""))


@dataclass(frozen=True)
class Reading:
    """How a folder is read: the split, whether links are followed, and the budgets a file must
    keep to. An index keeps it (`record`), so that a later `--add` reads its folder the same way."""

    words: int = 120  # a passage holds at most this many words
    overlap: int = 20  # words repeated where a paragraph is cut
    follow_links: bool = False  # read what a link inside the folder points to
    max_file_mb: float = 64  # a file larger than this is skipped
    max_pdf_pages: int = 2000
    max_pdf_text_mb: float = 32  # MB of page content a PDF may hold to interpret

    @classmethod
    def of(cls, index) -> "Reading":
        """The reading an `IndexConfig` asks for."""
        return cls(index.passage_words, index.passage_overlap, index.follow_links, index.max_file_mb, index.max_pdf_pages,
                   index.max_pdf_text_mb)

    @classmethod
    def recorded(cls, documents: dict) -> "Reading":
        """The reading an index's documents record holds (an older record: today's defaults beyond the split)."""
        return cls(**{name: documents[name] for name in cls.__dataclass_fields__ if name in documents})

    def record(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


# ---------------------------------------------------------------- splitting


SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])")  # the space after a sentence's end


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each with its whitespace closed up; a fenced code block is
    one paragraph that keeps its lines (their indentation too, without blank ones)."""
    found: list[str] = []
    prose: list[str] = []

    def close_prose() -> None:
        if prose:
            found.append(" ".join(" ".join(prose).split()))
            prose.clear()

    for code, lines in text_blocks(text):
        if code:
            close_prose()
            if kept := [line.rstrip() for line in lines if line.strip()]:
                found.append("\n".join([FENCE, *kept, FENCE]))
        elif lines[0].strip():
            prose.append(lines[0])
        else:
            close_prose()
    close_prose()
    return found


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


def _code_pieces(block: str, max_words: int) -> list[str]:
    """A code block over the budget as fenced blocks of whole lines (a line over it cut in windows)."""
    budget = max_words - 2  # the two fences count as words
    lines: list[str] = []
    for line in block.split("\n")[1:-1]:
        words = line.split()
        lines += [line] if len(words) <= budget else [" ".join(words[k:k + budget]) for k in range(0, len(words), budget)]
    pieces: list[str] = []
    current: list[str] = []
    size = 0  # the words of `current`
    for line in lines:
        if current and size + len(line.split()) > budget:
            pieces.append("\n".join([FENCE, *current, FENCE]))
            current, size = [], 0
        current.append(line)
        size += len(line.split())
    if current:
        pieces.append("\n".join([FENCE, *current, FENCE]))
    return pieces


def split_text(text: str, max_words: int = 120, overlap: int = 20) -> list[str]:
    """Passages of at most `max_words` words, a line per paragraph: whole paragraphs packed
    together while they fit; a longer paragraph in sentence runs, each later run starting with the
    last sentences (at most `overlap` words) of the run before it; a longer code block in blocks of
    whole lines. Paragraphs that fit are never cut or repeated. The lines keep a page's structure
    for the fact extractor (a code block, a list item, a sentence that introduces what follows it);
    quotes are matched ignoring spaces."""
    chunks: list[str] = []
    current: list[str] = []  # the lines of the passage being packed
    packed = 0  # their words

    def emit() -> None:
        if current:
            chunks.append("\n".join(current))
            current.clear()

    for paragraph in paragraphs(text):
        size = len(paragraph.split())
        if size <= max_words:
            if packed + size > max_words:
                # a line that introduces this paragraph ("For example:") goes with it, where both fit
                intro = current.pop() if len(current) > 1 and current[-1].endswith(":") and len(current[-1].split()) + size <= max_words else None
                emit()
                current += [intro] if intro else []
                packed = len(intro.split()) if intro else 0
            current.append(paragraph)
            packed += size
            continue
        emit()
        packed = 0
        if paragraph.startswith(FENCE):
            chunks += _code_pieces(paragraph, max_words)
            continue
        run: list[str] = []  # the words of the paragraph's run being packed
        carried: list[list[str]] = []  # the sentences the next run repeats
        for piece in _pieces(paragraph, max_words):
            if len(run) + len(piece) > max_words:
                chunks.append(" ".join(run))
                run = [w for sentence in carried for w in sentence]
                if len(run) + len(piece) > max_words:  # the overlap and the piece do not fit together
                    run = []
            run += piece
            carried = (carried + [piece]) if len(piece) <= overlap else []
            while carried and sum(map(len, carried)) > overlap:
                carried.pop(0)
        chunks.append(" ".join(run))
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


BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # UTF-32 LE's mark begins with UTF-16 LE's
CONTROL = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ufffd]")  # C0 but tab, newlines and form feed; DEL, C1, U+FFFD
MAX_CONTROL = 0.01  # text has hardly any control characters; binary data, read as text, about one in ten


def binary_problem(text: str) -> str | None:
    """Why decoded data is not text (None: it is), judged on the whole of it: NULs, or more than
    one character in a hundred a control character (or undecodable)."""
    if "\x00" in text:
        return "binary data, not text (it holds NUL bytes)"
    control = sum(1 for _ in CONTROL.finditer(text))
    if control > MAX_CONTROL * len(text):
        return f"binary data, not text ({control} of its {len(text)} characters are control characters)"
    return None


def utf16_without_mark(data: bytes) -> str | None:
    """"utf-16-le"/"utf-16-be" for UTF-16 text without a byte-order mark, told by the NUL in every
    other byte that Latin-script text has in it (None: not such text)."""
    sample = data[:8192]
    if len(data) % 2 or len(sample) < 2:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    pairs = len(sample) // 2
    if odd >= 0.3 * pairs and even <= 0.02 * pairs:
        return "utf-16-le"
    if even >= 0.3 * pairs and odd <= 0.02 * pairs:
        return "utf-16-be"
    return None


def encoding_of(data: bytes) -> str | None:
    """The encoding the bytes declare by a byte-order mark or show as UTF-16 (None: neither)."""
    return next((codec for mark, codec in BOMS if data.startswith(mark)), None) or utf16_without_mark(data)


def decoded(data: bytes) -> str:
    """Text by its bytes: a byte-order mark names UTF-8, UTF-16 or UTF-32, UTF-16 without one
    shows by its NULs; else UTF-8, else Windows-1252 (Latin-1 for the bytes it leaves undefined).
    Data that is not text (`binary_problem`) is a ValueError."""
    if codec := encoding_of(data):
        try:
            text = data.decode(codec)
        except UnicodeDecodeError:
            raise ValueError(f"not {codec.upper().removesuffix('-SIG')} text, though its first bytes say so") from None
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            try:
                text = data.decode("cp1252")
            except UnicodeDecodeError:
                text = data.decode("latin-1")
    if problem := binary_problem(text):
        raise ValueError(problem)
    return text


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
            body.append(FENCE)  # as a fence of backticks, whatever the file's fence and language
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
HTML_BLOCKS = {"p", "div", "section", "article", "main", "li", "ul", "ol", "dl", "dt", "dd", "table", "tr", "pre",
               "blockquote", "figure", "figcaption", "br", "hr", "address", "details", "summary"}
HTML_CELLS = {"td", "th"}  # a table row is one paragraph, its cells joined by " | " ("Release version | 1.56.0")
CELL_END = "\ue000"  # marks the end of a cell among a paragraph's words (a private-use character: no text has it)
LINK_DENSITY = 0.8  # a paragraph with at least this share of its words in links is navigation
# not "head": lxml puts in it what comes before a page's first body element when the page has no <body> tag
HTML_NOISE = frozenset({"title", "script", "style", "noscript", "nav", "header", "footer", "aside", "form", "template", "svg",
                        "button", "iframe"})
META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([\w.:-]+)""", re.IGNORECASE)
XML_DECLARATION = re.compile(r"\s*<\?xml[^>]*>")  # lxml refuses text that declares an encoding
BEFORE_MARK = re.compile(r"\s+([.,;:!?%)\]])")
CELL_ENDS = re.compile(rf"(?:\s*{CELL_END})+\s*")


class NotForIndexing(ValueError):
    """A page that is no content of its own: one that asks search engines not to index it
    (`<meta name="robots" content="noindex">`: a generated site's copy of other pages, such as
    mdBook's print.html, the whole book again, and toc.html), or a redirect stub (`<meta
    http-equiv="refresh">`, "Redirecting to ..."). Read, they would repeat other pages' passages."""


def not_content(root) -> str | None:
    """Why an HTML page is `NotForIndexing`, or None."""
    metas = list(root.iter("meta"))
    robots = next((meta for meta in metas if (meta.get("name") or "").lower() == "robots"), None)
    if robots is not None and "noindex" in (robots.get("content") or "").lower():
        return "the page asks not to be indexed (robots noindex)"
    if any((meta.get("http-equiv") or "").lower() == "refresh" for meta in metas):
        return "the page redirects to another (meta refresh)"
    return None


def html_markup(data: bytes) -> str:
    """An HTML page as text: by a byte-order mark (or UTF-16's NULs), else by the charset a
    `<meta>` in its first 4 KB declares, else as `decoded` reads any text."""
    declared = None if encoding_of(data) or b"\x00" in data else META_CHARSET.search(data[:4096])
    if declared:
        try:
            text = data.decode(codecs.lookup(declared.group(1).decode("ascii")).name)
        except (LookupError, UnicodeDecodeError):
            pass
        else:
            if problem := binary_problem(text):
                raise ValueError(problem)
            return XML_DECLARATION.sub("", text, count=1)
    return XML_DECLARATION.sub("", decoded(data), count=1)


def html_strings(element, leave_out: Collection[str] = HTML_NOISE) -> Iterator[str]:
    """An element's text pieces in document order, without comments and the `leave_out`
    elements (the text after one is kept)."""
    if element.text:
        yield element.text
    for child in element:
        if isinstance(child.tag, str) and child.tag not in leave_out:
            yield from html_strings(child, leave_out)
        if child.tail:
            yield child.tail


def spaced_text(element) -> str:
    """An element's text pieces joined by spaces, whitespace closed up (a heading, a title)."""
    return " ".join(" ".join(html_strings(element)).split())


def drop(element) -> None:
    """Take an element out of its page; the text after it stays a word of its own (in a code
    block, where every character counts, it joins the text before it)."""
    if element.tail and not any(above.tag == "pre" for above in element.iterancestors()):
        element.tail = " " + element.tail
    element.drop_tree()


# class -> the tag it is furniture on ("§", "Source", "Run", "Expand description", versions; None: any): a rustdoc
# source page's <body> has the class "src" too
RUSTDOC_FURNITURE = {"doc-anchor": "a", "anchor": "a", "src": "a", "test-arrow": "a", "hideme": "summary", "rightside": None}
RUSTDOC_FURNITURE_IDS = {"blanket-implementations", "blanket-implementations-list"}  # `Any`, `From`, `Into`, ...: on every type


def rustdoc_title(root, title: str) -> str | None:
    """A rustdoc page's furniture taken out, and its title (`title`: its `<title>`'s text): an API page's item kind and path
    ("Function std::env::var", from `<title>` "var in std::env - Rust" and `<h1>` "Function
    var"), a source page's path ("Source std/env.rs"). Out go heading anchors ("§"), the "Expand
    description" toggle, "Source", "Run" and "Read more" links, a source page's line numbers,
    each method's version and the blanket implementations every type repeats; the page's own
    version reads "Stable since Rust version 1.0.0". Code (a signature, a heading such as
    `impl<T> Rc<T>`) reads as written, not spaced at each link; an item table's name leads its
    description ("env: Inspection and manipulation of ..."); an item with no text under it (an
    implementor, `type Output = Instant`) keeps its heading as its line. None: not rustdoc's page."""
    if not any((meta.get("name") or "").lower() == "generator" and meta.get("content") == "rustdoc" for meta in root.iter("meta")):
        return None
    for element in [element for element in root.iter() if isinstance(element.tag, str)]:
        classes = set((element.get("class") or "").split())
        furniture = any(RUSTDOC_FURNITURE.get(name, element.tag) in (None, element.tag) for name in classes & RUSTDOC_FURNITURE.keys())
        if furniture or element.get("id") in RUSTDOC_FURNITURE_IDS or (element.tag == "a" and (
                "data-nosnippet" in element.attrib or (element.text or "").strip() == "Read more" and not len(element))):
            if element.getparent() is not None:
                drop(element)
    for element in [element for element in root.iter() if isinstance(element.tag, str)]:  # what is left, furniture gone
        classes = set((element.get("class") or "").split())
        if "since" in classes and element.get("title"):
            element.text, element[:] = element.get("title"), []
            element.tail = (element.tail or "").replace("·", "", 1)
        elif element.tag == "code" or "code-header" in classes:
            element.text, element[:] = "".join(html_strings(element)), []
            above = element.getparent()
            if "code-header" in classes and above is not None and above.getparent() is not None and above.getparent().tag != "summary":
                line = element.makeelement("p", {})  # an item with no text under it (`type Output = Instant`): its heading is its line
                line.text = element.text
                element.addnext(line)
    for name in root.iterfind(".//dl[@class='item-table']/dt"):
        described = name.getnext()
        if described is not None and described.tag == "dd":
            described.text = f"{spaced_text(name)}: {described.text or ''}"
            drop(name)
    named = re.fullmatch(r"(.+?) in (.+) - Rust", title)
    path = f"{named[2]}::{named[1]}" if named else title.removesuffix(" - Rust")
    heading = root.find(".//div[@class='main-heading']/h1")
    if heading is None:
        return path or None
    kind, file = " ".join((heading.text or "").split()), "".join("".join(html_strings(heading)).split())
    drop(heading)
    return f"Source {file}" if title.endswith(" - source") else f"{kind} {path}".strip()


def read_html(path: Path, data: bytes) -> tuple[str, list[Section]]:
    """The main text (`<main>`, else `<article>`, else `<body>`) without scripts, navigation,
    headers and footers, a paragraph per block element and per table row; `<h1>`-`<h6>` start
    sections titled by the headings above them ("Details › Migration"), the page's `<title>` (or
    first `<h1>`) titles it, without the site's name where the `<h1>` is the rest of it
    ("Rust 2015 - The Rust Edition Guide" with `<h1>` "Rust 2015": "Rust 2015"). A word-break
    hint (`<wbr>`) joins its word; rustdoc's API pages lose their furniture (`rustdoc_title`)."""
    html = _optional("lxml.html", "HTML", "lxml")
    markup = html_markup(data)
    if not markup.strip():
        return humanised(path.stem), []
    root = html.document_fromstring(markup)
    if reason := not_content(root):
        raise NotForIndexing(reason)
    for hint in list(root.iter("wbr")):  # lxml's parser reads a <wbr> as holding the text after it
        hint.drop_tag()
    found = root.find(".//title")
    title = spaced_text(found) if found is not None else ""
    title = rustdoc_title(root, title) or title
    sections: list[Section] = []
    trail: list[tuple[int, str]] = []  # the headings above the current block, with their levels
    body, words = [], []  # words: (text, inside a link)

    def paragraph() -> None:
        """The words read since the last block as a paragraph, unless nearly all are link text
        (a menu, a table of contents, a list of links: navigation, not content)."""
        if all(text.isspace() for text, _ in words):
            words.clear()
            return
        text = BEFORE_MARK.sub(r"\1", " ".join(" ".join(t for t, _ in words).split()))
        text = CELL_ENDS.sub(" | ", text).strip(" |")  # empty cells and the row's end leave no "|"
        linked = sum(len(t.split()) for t, in_link in words if in_link)
        if text and linked < LINK_DENSITY * len(text.replace(" | ", " ").split()):
            body.append(text)
        words.clear()

    def walk(node, in_link: bool = False) -> None:
        nonlocal trail, title
        if node.text:
            words.append((node.text, in_link))
        for child in node:
            name = child.tag if isinstance(child.tag, str) else None  # None: a comment or a processing instruction
            if name is None or name in HTML_NOISE:
                pass
            elif name in HTML_HEADINGS:
                paragraph()
                if body:
                    sections.append(Section(SECTION_MARK.join(text for _, text in trail), "\n\n".join(body)))
                    body.clear()
                text, level = spaced_text(child), int(name[1])
                if level == 1 and (not title or without_site(title, text)):
                    title = text
                elif text and not (level == 1 and text == title):
                    trail = [(above, heading) for above, heading in trail if above < level] + [(level, text)]
            elif name == "pre":  # a code block: its lines kept, fenced
                paragraph()
                lines = [line.rstrip() for line in "".join(html_strings(child)).split("\n") if line.strip()]
                if lines:
                    body.append("\n".join([FENCE, *lines, FENCE]))
            elif name in HTML_BLOCKS:
                paragraph()
                walk(child, in_link)
                paragraph()
            elif name in HTML_CELLS:
                walk(child, in_link)
                words.append((CELL_END, False))
            else:
                walk(child, in_link or name == "a")
            if child.tail:
                words.append((child.tail, in_link))

    outside = lambda element: not any(isinstance(above.tag, str) and above.tag in HTML_NOISE for above in element.iterancestors())  # noqa: E731
    start = next((element for tag in ("main", "article") for element in root.iter(tag) if outside(element)), None)
    start = start if start is not None else next(root.iter("body"), root)
    walk(start)
    paragraph()
    if body:
        sections.append(Section(SECTION_MARK.join(text for _, text in trail), "\n\n".join(body)))
    return title or humanised(path.stem), sections


SITE_SEPARATORS = (" - ", " | ", " — ", " – ", " · ", " :: ")  # between a page's name and its site's in a <title>


def without_site(title: str, h1: str) -> bool:
    """Whether `title` is the page's `h1` and its site's name ("Rust 2015 - The Rust Edition
    Guide", "Rust 2015"), either way round: the `h1` alone then titles the page."""
    return any(title.startswith(h1 + mark) or title.endswith(mark + h1) for mark in SITE_SEPARATORS) if h1 else False


class OverBudget(ValueError):
    """A file over one of the `Reading` budgets: skipped with one line, the rest read on."""


def pdf_page_count(reader, budget: int) -> int:
    """The pages of a PDF's page tree, counted without expanding it past `budget`: a tree that
    names one subtree many times (40 x 40 x 40 kids is 64,000 pages in 1.4 KB), or loops, is
    refused before pypdf lists its pages."""
    stack, pages, nodes = [reader.trailer["/Root"]["/Pages"]], 0, 0
    while stack:
        node = stack.pop().get_object()
        nodes += 1
        if "/Kids" in node:
            stack.extend(node["/Kids"])
        else:
            pages += 1
        if pages > budget:
            raise OverBudget(f"a PDF of more than {budget} pages, over the page budget (index.max_pdf_pages)")
        if nodes > 4 * budget + 64:
            raise OverBudget(f"a PDF whose page tree has more than {4 * budget + 64} nodes for {pages} pages: it loops")
    return pages


def read_pdf(path: Path, data: bytes, max_pages: int = 2000, max_text_mb: float = 32) -> tuple[str, list[Section]]:
    """One section a page ("p. 3"); lines joined into paragraphs, words hyphenated across a line
    break joined again. The title is the PDF's own when it has one. A PDF of more than
    `max_pages` pages, or whose pages hold more than `max_text_mb` MB of content to interpret
    (a few KB inflate to that), is `OverBudget` before its text is read."""

    pypdf = _optional("pypdf", "PDF")
    reader = pypdf.PdfReader(io.BytesIO(data))
    pdf_page_count(reader, max_pages)
    title = ((reader.metadata.title if reader.metadata else None) or "").strip()
    left = int(max_text_mb * 2**20)  # bytes of page content still to interpret
    operations = left // 4  # and operations: a form drawn many times is interpreted each time
    over = OverBudget(f"a PDF of more than {max_text_mb:g} MB of page content to read, over the text budget (index.max_pdf_text_mb)")

    def count(operator, operands, cm, tm) -> None:
        nonlocal operations
        operations -= 1
        if operations < 0:
            raise over

    sections = []
    for number, page in enumerate(reader.pages, start=1):
        contents = page.get_contents()
        left -= len(contents.get_data()) if contents is not None else 0
        if left < 0:
            raise over
        text = page.extract_text(visitor_operand_before=count) or ""
        text = re.sub(r"(\w)-\n(\w)", r"\1\2", text)
        text = re.sub(r"(?<!\n)\n(?!\n)", " ", text)
        if text.strip():
            sections.append(Section(f"p. {number}", text))
    return title or humanised(path.stem), sections


def read_corpus_file(path: Path, data: bytes) -> list[Passage]:
    """Today's corpus files: a JSON list of {"title", "text"}, or JSON lines of them."""

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


def _optional(module: str, kind: str, package: str | None = None):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"reading {kind} files needs the {package or module} package: {DOCS_HINT}") from None


def read_document(path: Path, relative: str, reading: Reading = Reading(), data: bytes | None = None) -> Document:
    """One file (its bytes `data`, where already read) as a `Document`; ValueError (with the
    reason) when it cannot be read as its kind, `OverBudget` when it is larger than the reading
    allows."""
    if data is None:
        size = path.stat().st_size
        if size > reading.max_file_mb * 2**20:
            raise OverBudget(f"{size / 2**20:.1f} MB, over the budget of {reading.max_file_mb:g} MB a file (index.max_file_mb)")
        data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    named = Path(PurePosixPath(relative).name)  # the escaped name: titles must be text
    suffix = path.suffix.lower()
    try:
        if suffix in CORPUS_SUFFIXES:
            return Document(relative, humanised(named.stem), [], digest, passages=read_corpus_file(named, data))
        if suffix == ".pdf":
            title, sections = read_pdf(named, data, reading.max_pdf_pages, reading.max_pdf_text_mb)
        else:
            title, sections = READERS[suffix](named, data)
    except (MissingExtra, OverBudget, NotForIndexing):
        raise
    except HyperProveError as error:  # a corpus file's field check, which names the file itself
        raise ValueError(str(error).removeprefix(f"{named}: ")) from None
    except (ValueError, RecursionError) as error:
        raise ValueError(str(error) or type(error).__name__) from None
    except Exception as error:  # a format library's own failure on a damaged file is that file's problem only
        raise ValueError(f"{type(error).__name__}: {error}") from None
    return Document(relative, " ".join(title.split()), [s for s in sections if s.text.strip()], digest)


class ParsedDocuments:
    """Each document's passages (or why it was left out) as its reader gave them, one JSON file
    under a key of the document's content, its path in the folder, the reading, and this
    module's own code with the versions of the libraries it reads with (any change to how a file
    is read makes new keys). A folder read again, by an update or by a deletion that must know
    which other document holds a passage, then parses only the files that changed."""

    def __init__(self, cache_dir: str | Path):
        from pipeline.files import clear_scratch

        self.directory = Path(cache_dir) / "documents"
        clear_scratch(self.directory, depth=2)  # entries a killed read was writing
        self.reader = reader_code()

    def key(self, relative: str, digest: str, reading: Reading) -> str:
        return hashlib.sha256(json.dumps([self.reader, relative, digest, reading.record()]).encode("utf-8", "surrogateescape")).hexdigest()

    def get(self, key: str) -> list[Passage] | str | None:
        try:
            found = json.loads((self.directory / key[:2] / f"{key}.json").read_text(encoding="utf-8"))
            return found if isinstance(found, str) else [Passage(title, text, source) for title, text, source in found]
        except (OSError, ValueError, TypeError):
            return None  # missing, or damaged: read again

    def put(self, key: str, read: list[Passage] | str) -> None:
        from pipeline.files import atomic_write_bytes

        value = read if isinstance(read, str) else [[p.title, p.text, p.source] for p in read]
        path = self.directory / key[:2] / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogateescape"), sync=False)


class ParsedInMemory(ParsedDocuments):
    """What a Ray worker reads through: it finds nothing and keeps what it is given (`entries`),
    for the driver to write (workers write no files)."""

    def __init__(self):
        self.reader, self.entries = reader_code(), {}

    def get(self, key: str) -> None:
        return None

    def put(self, key: str, read: list[Passage] | str) -> None:
        self.entries[key] = read


def reader_code() -> str:
    """sha256 of the code that decides what a file reads as, and of the libraries it reads with."""
    code = b"".join(Path(module.__file__).read_bytes() for module in reader_modules())
    return hashlib.sha256(code + " ".join(library_versions()).encode()).hexdigest()


def reader_modules() -> list:
    """The modules whose code decides what a file reads as: this one, the corpus-file reader and
    the text blocks a passage keeps."""
    import sys

    return [sys.modules[__name__], sys.modules[corpus_passage.__module__], sys.modules[text_blocks.__module__]]


def library_versions() -> list[str]:
    """The versions of the format libraries that are installed (they shape what a file reads as)."""
    found = []
    for name in ("lxml", "pypdf"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} none")
    return found


def read_passages(path: Path, relative: str, reading: Reading, parsed: ParsedDocuments | None = None) -> tuple[list[Passage] | str, str | None]:
    """A file's passages, or why it is left out (one line's reason), with the sha256 of its
    bytes (None where they were not read): from `parsed` where it holds this content read this
    way, else read (`read_document`) and kept there."""
    try:
        size = path.stat().st_size
        if size > reading.max_file_mb * 2**20:
            return f"{size / 2**20:.1f} MB, over the budget of {reading.max_file_mb:g} MB a file (index.max_file_mb)", None
        data = path.read_bytes()
    except OSError as error:
        return f"cannot read it ({error.strerror or error})", None
    digest = hashlib.sha256(data).hexdigest()
    key = parsed.key(relative, digest, reading) if parsed else None
    if key and (found := parsed.get(key)) is not None:
        return found, digest
    try:
        read = document_passages(read_document(path, relative, reading, data), reading.words, reading.overlap)
    except (OverBudget, NotForIndexing) as error:
        read = str(error)
    except ValueError as error:
        read = f"not a readable {path.suffix[1:].upper()} file ({error})"
    if key:
        parsed.put(key, read)
    return read, digest


def is_index(folder: Path) -> bool:
    """A HyperProve index (say one written inside the folder it was built from): not documents.
    A manifest alone does not make one; its passages and facts must be there beside it."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        files = manifest.get("files")
    except (OSError, ValueError, AttributeError):
        return False
    return (manifest.get("format") == "hyperprove-index" and isinstance(files, dict)
            and all(name in files and (folder / name).is_file() for name in ("passages.jsonl", "facts.jsonl")))


def shown(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (which the OS hands over as surrogates)
    written as \\xNN, so the name can be printed, saved and matched again."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def document_files(folder: Path, follow_links: bool = False, log: Callable[[str], None] = print,
                   ours: Collection[str] = ()) -> Iterator[tuple[Path, str]]:
    """Every file under `folder`, in path order, with its path relative to `folder` (`shown`).
    Left out, each with one line: hidden files and folders, HyperProve indexes, what is not a
    file or a folder, and links, which lead out of the folder (with `follow_links` they are
    followed, files and folders alike, but a link back into a folder being read is a loop).
    Left out without a word: the paths `ours` names (real paths: the lock and checkpoints of the
    index being built)."""

    def walk(directory: Path, relative: str, inside: tuple[str, ...]) -> Iterator[tuple[Path, str]]:
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError as error:
            log(f"{shown(str(directory))}: skipped: cannot list it ({error.strerror or error})")
            return
        for entry in entries:
            path, name = Path(entry.path), relative + shown(entry.name)
            if ours and os.path.realpath(path) in ours:
                continue
            said = shown(entry.path)  # the path as the lines name it
            if entry.name.startswith("."):
                log(f"{said}{'/' * entry.is_dir()}: left out: hidden")
                continue
            real = path
            if entry.is_symlink():
                target = os.path.realpath(path)
                if not follow_links:
                    log(f"{said}: skipped: a link (to {shown(target)}); a folder is read only through its own files "
                        "(index --follow-links reads what its links point to)")
                    continue
                if not os.path.exists(target):
                    log(f"{said}: skipped: a link to nothing ({shown(target)})")
                    continue
                real = Path(target)
            if real.is_dir():
                key = os.path.realpath(real)
                if key in inside:
                    log(f"{said}/: skipped: a link back to {shown(key)}, a folder being read (a loop)")
                elif is_index(real):
                    log(f"{said}/: left out: a HyperProve index")
                else:
                    yield from walk(real, name + "/", (*inside, key))
            elif real.is_file():
                yield path, name  # read through its name here: its kind is the name's
            else:
                log(f"{said}: skipped: not a file or a folder")

    if is_index(folder):
        log(f"{shown(str(folder))}/: left out: a HyperProve index")
        return
    yield from walk(folder, "", (os.path.realpath(folder),))


REPEATS = "every passage repeats an earlier file's"


def is_document(path: Path) -> bool:
    """A file of a kind the folder reader reads (the others are counted, not read)."""
    return path.suffix.lower() in READERS or path.suffix.lower() in CORPUS_SUFFIXES


def read_folder(folder: str | Path, reading: Reading = Reading(), log: Callable[[str], None] = print,
                prefix: str = "", leave_out: Collection[str] = (), progress: bool = False,
                parsed: ParsedDocuments | None = None) -> FolderCorpus:
    """Every document under `folder` as passages (`document_files`, then `read_documents`, with
    `parsed`). A folder with no text in it is an error. `progress`: a bar of the files read,
    with the passages so far, the rate and the time left."""
    root = Path(folder)
    if not root.is_dir():
        raise HyperProveError(f"{root}: not a folder")
    listing: list[str] = []
    files = list(document_files(root, reading.follow_links, lambda line: (listing.append(line), log(line))))
    from tqdm import tqdm

    bar = tqdm(total=len(files), desc="read files", unit="file", disable=not progress, mininterval=1.0)
    corpus = read_documents(root, files, reading, log, prefix, leave_out, bar, parsed)
    bar.close()
    corpus.skipped[:0] = listing
    if not corpus.passages:
        raise HyperProveError(f"{root}: no document with text in it" + (f" ({len(corpus.skipped)} skipped)" if corpus.skipped else ""))
    return corpus


def read_documents(root: Path, files: Iterable[tuple[Path, str]], reading: Reading = Reading(), log: Callable[[str], None] = print,
                   prefix: str = "", leave_out: Collection[str] = (), bar=None, parsed: ParsedDocuments | None = None) -> FolderCorpus:
    """The listed files (path, path in `root`) as passages, each document's path `prefix` + its
    path in `root`, but for those `leave_out` names. A file that cannot be read, is empty or is
    over a budget is reported (one line) and skipped; a passage that repeats an earlier one word
    for word is kept once. `bar`: a tqdm bar moved a file at a time, showing the passages so far.
    `parsed`: where the files read are kept, and unchanged ones found without being parsed."""
    corpus = FolderCorpus(root=root, passages=[], files={})
    taken: set[Passage] = set()

    def left_out(line: str) -> None:
        corpus.skipped.append(line)
        log(line)

    for path, relative in files:
        if bar is not None:
            bar.set_postfix_str(f"{len(corpus.passages)} passages", refresh=False)
            bar.update()
        relative = prefix + relative
        if relative in leave_out:
            continue
        if not is_document(path):
            suffix = path.suffix.lower()
            corpus.other_kinds[suffix] = corpus.other_kinds.get(suffix, 0) + 1
            continue
        every, digest = read_passages(path, relative, reading, parsed)
        if isinstance(every, str):
            problem = every
        else:
            passages = [p for p in every if not (p in taken or taken.add(p))]
            if passages:
                corpus.passages += passages
                corpus.files[relative] = digest
                continue
            problem = REPEATS if every else "no text"
        left_out(f"{shown(str(path))}: skipped: {problem}")
    if bar is not None:
        bar.set_postfix_str(f"{len(corpus.passages)} passages")
    return corpus


def file_of(source: str | None) -> str | None:
    """"docs/a.md#3" -> "docs/a.md"."""
    return source.rpartition("#")[0] if source else None
