"""A folder of documents as a corpus: each format read, the split, and an index kept up to date with
a changing folder (only the passages whose text changed are redone)."""

import json

import pytest

from modules.errors import HyperProveError
from pipeline.cli import main
from pipeline.index.documents import Section, read_folder, read_html, read_markdown, read_pdf, read_plain, split_text
from tests.support import Scripted


def words(n: int, start: int = 0) -> str:
    return " ".join(f"W{k}" for k in range(start, start + n))


def test_paragraphs_that_fit_are_packed_whole():
    text = f"{words(30)}\n\n{words(50, 30)}\n\n{words(40, 80)}\n\n\n{words(10, 120)}"
    # 30 + 50 fit in 100; 40 does not fit beside them and starts the next; 10 joins it; a line a paragraph
    assert split_text(text, max_words=100, overlap=20) == [f"{words(30)}\n{words(50, 30)}", f"{words(40, 80)}\n{words(10, 120)}"]


def test_a_long_paragraph_is_cut_at_sentences_with_overlap():
    sentences = [f"{words(12, 12 * k)}." for k in range(5)]  # five sentences of 12 words
    chunks = split_text(" ".join(sentences), max_words=30, overlap=15)
    # 12+12 fit; the third would make 36: cut, and the next run repeats the last sentence (12 <= 15)
    assert chunks == [" ".join(sentences[0:2]), " ".join(sentences[1:3]), " ".join(sentences[2:4]), " ".join(sentences[3:5])]
    assert all(len(chunk.split()) <= 30 for chunk in chunks)
    # without overlap nothing repeats
    assert split_text(" ".join(sentences), max_words=30, overlap=0) == [" ".join(sentences[0:2]), " ".join(sentences[2:4]), sentences[4]]


def test_a_sentence_longer_than_the_budget_is_cut_in_windows():
    assert split_text(words(25), max_words=10, overlap=0) == [words(10), words(10, 10), words(5, 20)]


def test_markdown_headings_become_sections_and_marks_go(tmp_path):
    text = b"""---
layout: page
title: "The Title"
---
Before any heading, see [the site](http://example.org) and **this**.

## Early life
- Born in `London`.

### School
Went to school.

Career
------
Worked.
```
# a comment, not a heading
```
"""
    title, sections = read_markdown(tmp_path / "page.md", text)
    assert title == "The Title"
    assert [(s.heading, " ".join(s.text.split())) for s in sections] == [
        ("", "Before any heading, see the site and this."),
        ("Early life", "Born in London."),
        ("Early life › School", "Went to school."),
        ("Career", "Worked. ``` # a comment, not a heading ```"),
    ]
    assert sections[-1].text.endswith("Worked.\n```\n# a comment, not a heading\n```")  # a code block keeps its fences and lines


def test_markdown_first_level_one_heading_is_the_title(tmp_path):
    title, sections = read_markdown(tmp_path / "notes_on-things.md", b"# Ada Lovelace\n\nA mathematician.\n\n# Later\nMore.")
    assert title == "Ada Lovelace" and [(s.heading, s.text.strip()) for s in sections] == [("", "A mathematician."), ("Later", "More.")]
    title, _ = read_markdown(tmp_path / "notes_on-things.md", b"Just text.")
    assert title == "notes on things"


def test_html_main_text_without_navigation_scripts_footer_or_link_lists(tmp_path):
    page = b"""<html><head><title>Lord Byron</title><style>p {}</style></head><body>
    <nav><a href="/">Home</a></nav><header>Site header</header>
    <main><h1>Lord Byron</h1><div class="toc"><a href="#life">Life</a> | <a href="#family">Family and heirs</a></div>
    <p>Lord Byron was a <b>poet</b>, see <a href="/poets">the poets</a>.</p><!-- hidden -->
    <h2>Family</h2><ul><li>Daughter: Ada</li><li>Wife: Anne</li></ul><div>A loose line<br>and another</div>
    <script>var x = "not text";</script></main><footer>Copyright</footer></body></html>"""
    title, sections = read_html(tmp_path / "byron.html", page)
    assert title == "Lord Byron"
    assert [(s.heading, s.text) for s in sections] == [
        ("", "Lord Byron was a poet, see the poets."),  # the table of contents (all links) is navigation
        ("Family", "Daughter: Ada\n\nWife: Anne\n\nA loose line\n\nand another"),
    ]


def test_an_html_table_row_is_one_paragraph_its_cells_joined(tmp_path):
    page = b"""<main><h1>Rust 2021</h1><table><thead><tr><th>Info</th><th></th></tr></thead><tbody>
    <tr><td>RFC</td><td><a href="/rfcs/3085">#3085</a></td></tr>
    <tr><td>Release version</td><td><a href="/blog">1.56.0</a></td></tr>
    <tr><td><a href="/a">Previous</a></td><td><a href="/b">Next</a></td></tr></tbody></table>
    <p>The edition adds a prelude.</p></main>"""
    _, (section,) = read_html(tmp_path / "index.html", page)
    # the empty header cell leaves no "|"; a cell that is all link is content beside its label; a row of links is navigation
    assert section.text == "Info\n\nRFC | #3085\n\nRelease version | 1.56.0\n\nThe edition adds a prelude."


def pdf_bytes(pages: list[str], title: str | None = None) -> bytes:
    """A minimal PDF, one line of Helvetica text a page, its xref offsets computed."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objects)} 0 R "
                       "/Resources << /Font << /F1 3 0 R >> >> >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    if title:
        objects.append(f"<< /Title ({title}) >>")
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode() + b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    info = f" /Info {len(objects)} 0 R" if title else ""
    return out + f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R{info} >>\nstartxref\n{xref}\n%%EOF\n".encode()


def test_pdf_pages_become_sections_titled_by_the_pdf(tmp_path):
    title, sections = read_pdf(tmp_path / "a_report.pdf", pdf_bytes(["Ada was born in 1815.", "She died in 1852."], title="Ada's life"))
    assert title == "Ada's life"
    assert [(s.heading, s.text.strip()) for s in sections] == [("p. 1", "Ada was born in 1815."), ("p. 2", "She died in 1852.")]
    title, _ = read_pdf(tmp_path / "a_report.pdf", pdf_bytes(["x"]))
    assert title == "a report"


def test_plain_text_takes_a_heading_line_as_its_title(tmp_path):
    assert read_plain(tmp_path / "b.txt", b"Charles Babbage\n\nHe was born in 1791.")[0] == "Charles Babbage"
    assert read_plain(tmp_path / "b_c.txt", b"He was born in 1791.\n\nHe died.")[0] == "b c"


def test_a_folder_reads_every_kind_and_reports_what_it_skips(tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.md").write_text("# Ada\n\nAda was a mathematician.\n\n## Family\nHer father was Byron.\n")
    (docs / "sub" / "b.txt").write_text("Babbage was born in London.")
    (docs / "c.html").write_text("<title>Byron</title><p>Byron was a poet.</p>")
    (docs / "d.pdf").write_bytes(pdf_bytes(["Anne was born in 1792."]))
    (docs / "e.json").write_text(json.dumps([{"title": "Jaws", "text": "Jaws is a film."}]))
    (docs / "f.jsonl").write_text(json.dumps({"title": "Ohio", "text": "Ohio is a state."}) + "\n")
    (docs / "copy.md").write_text("# Ada\n\nAda was a mathematician.\n")  # every passage repeats a.md's
    (docs / "binary.txt").write_bytes(b"\x00\x01\x02")
    (docs / "empty.md").write_text("\n\n")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    (docs / "bad.json").write_text(json.dumps([{"title": "x"}]))
    (docs / "picture.png").write_bytes(b"\x89PNG")
    (docs / ".hidden.md").write_text("secret")
    lines = []
    folder = read_folder(docs, log=lines.append)
    assert [(p.title, p.text, p.source) for p in folder.passages] == [
        ("Ada", "Ada was a mathematician.", "a.md#0"),
        ("Ada › Family", "Her father was Byron.", "a.md#1"),
        ("Byron", "Byron was a poet.", "c.html#0"),
        ("d › p. 1", "Anne was born in 1792.", "d.pdf#0"),
        ("Jaws", "Jaws is a film.", "e.json#0"),
        ("Ohio", "Ohio is a state.", "f.jsonl#0"),
        ("b", "Babbage was born in London.", "sub/b.txt#0"),
    ]
    assert sorted(folder.files) == ["a.md", "c.html", "d.pdf", "e.json", "f.jsonl", "sub/b.txt"]
    assert lines == [
        f"{docs / '.hidden.md'}: left out: hidden",
        f"{docs / 'bad.json'}: skipped: not a readable JSON file (item 0: field \"text\" is missing)",
        f"{docs / 'binary.txt'}: skipped: not a readable TXT file (binary data, not text (it holds NUL bytes))",
        f"{docs / 'broken.pdf'}: skipped: not a readable PDF file (PdfStreamError: Stream has ended unexpectedly)",
        f"{docs / 'copy.md'}: skipped: every passage repeats an earlier file's",
        f"{docs / 'empty.md'}: skipped: no text",
    ]
    assert folder.summary() == f"{docs}: 6 files, 7 passages; 6 left out (each named above); not documents, left alone: 1 .png"


def test_a_missing_format_library_names_the_extra(tmp_path, monkeypatch):
    import sys

    (tmp_path / "a.html").write_text("<p>x</p>")
    monkeypatch.setitem(sys.modules, "lxml.html", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(HyperProveError, match=r'reading HTML files needs the lxml package: pip install -e "\.\[docs\]"'):
        read_folder(tmp_path, log=lambda line: None)


def test_an_empty_folder_and_a_file_for_a_folder_are_one_line(tmp_path):
    with pytest.raises(HyperProveError, match="no document with text in it"):
        read_folder(tmp_path, log=lambda line: None)
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(HyperProveError, match="not a folder"):
        read_folder(tmp_path / "x.txt")


def passages(index_dir):
    return [json.loads(line) for line in (index_dir / "passages.jsonl").read_text().splitlines()]


def cli(capsys):
    """`hyperprove ARGS --embedder test-hash --json`, asserted to succeed: (its output, its JSON summary)."""
    scripted = Scripted()

    def run(*argv):
        code = main([str(a) for a in argv] + ["--embedder", "test-hash", "--json"], make_runtime=scripted)
        out = capsys.readouterr().out
        assert code == 0, out
        return out, json.loads(out.strip().splitlines()[-1])
    return run


def test_an_index_follows_a_changing_folder_passage_by_passage(tmp_path, capsys):
    docs, index = tmp_path / "docs", tmp_path / "idx"
    docs.mkdir()
    family = "Her father was Lord Byron, the poet."
    (docs / "ada.md").write_text(f"# Ada Lovelace\n\nAda Lovelace was a mathematician.\n\n## Family\n{family}\n")
    (docs / "babbage.txt").write_text("Charles Babbage\n\nBabbage was born in London in 1791.")
    run = cli(capsys)

    out, built = run("index", docs, "--out", index)
    assert (built["files"], built["passages"], built["skipped"]) == (2, 3, 0)
    assert f"{docs}: 2 files, 3 passages" in out
    first = passages(index)
    assert [(p["id"], p["source"]) for p in first] == [(0, "ada.md#0"), (1, "ada.md#1"), (2, "babbage.txt#0")]

    # a paragraph added before the family section: that passage comes, the others stay with their ids
    (docs / "ada.md").write_text(f"# Ada Lovelace\n\nAda Lovelace was a mathematician.\n\n## Work\nShe wrote the first program.\n\n## Family\n{family}\n")
    (docs / "lovelace.html").write_text("<title>William King</title><p>William King married Ada in 1835.</p>")
    out, changed = run("index", "--add", docs, "--into", index)
    assert "2 new or changed, 1 unchanged" in out and (changed["added"], changed["removed"]) == (2, 0)
    now = {p["source"]: (p["id"], p["text"]) for p in passages(index)}
    assert now == {"ada.md#0": (0, "Ada Lovelace was a mathematician."), "ada.md#1": (3, "She wrote the first program."),
                   "ada.md#2": (1, family), "babbage.txt#0": (2, "Babbage was born in London in 1791."),
                   "lovelace.html#0": (4, "William King married Ada in 1835.")}

    # the same folder again changes nothing
    out, again = run("index", "--add", docs, "--into", index)
    assert "0 new or changed, 3 unchanged" in out and again["added"] == again["removed"] == 0 and "nothing to add" in out

    # a changed sentence replaces that passage only; a file gone from the folder is kept and named
    (docs / "ada.md").write_text(f"# Ada Lovelace\n\nAda Lovelace was an English mathematician.\n\n## Work\nShe wrote the first program.\n\n## Family\n{family}\n")
    (docs / "babbage.txt").unlink()
    out, changed = run("index", "--add", docs, "--into", index)
    assert (changed["added"], changed["removed"]) == (1, 1)
    assert "1 in the index but no longer here, kept (index --delete FILE --into ... takes one out): babbage.txt" in out
    now = {p["source"]: p["id"] for p in passages(index)}
    assert now == {"ada.md#0": 5, "ada.md#1": 3, "ada.md#2": 1, "babbage.txt#0": 2, "lovelace.html#0": 4}

    # delete by the file's path; again, it was removed
    out, deleted = run("index", "--delete", docs / "babbage.txt", "--into", index)
    assert deleted["removed"] == 1 and sorted(p["source"] for p in passages(index)) == ["ada.md#0", "ada.md#1", "ada.md#2", "lovelace.html#0"]
    out, again = run("index", "--delete", docs / "babbage.txt", "--into", index)
    assert again["removed"] == 0 and "'babbage.txt') was removed in generation" in out
    manifest = json.loads((index / "manifest.json").read_text())
    assert sorted(manifest["documents"]["files"]) == ["ada.md", "lovelace.html"]

    # the kept-up index holds what a fresh build of the folder holds, passage for passage
    run("index", docs, "--out", tmp_path / "fresh")
    assert sorted((p["title"], p["text"], p["source"]) for p in passages(index)) == \
        sorted((p["title"], p["text"], p["source"]) for p in passages(tmp_path / "fresh"))


def test_a_passage_two_documents_share_stays_while_either_holds_it(tmp_path, capsys):
    # ada.md and notes/ada.md share their first passage (same title and text), indexed once under
    # ada.md; again.md repeats ada.md whole and is skipped
    docs, index = tmp_path / "docs", tmp_path / "idx"
    (docs / "notes").mkdir(parents=True)
    shared, family, work = "Ada Lovelace was a mathematician.", "Her father was Lord Byron, the poet.", "She wrote the first program."
    (docs / "ada.md").write_text(f"# Ada Lovelace\n\n{shared}\n\n## Family\n{family}\n")
    (docs / "again.md").write_text(f"# Ada Lovelace\n\n{shared}\n\n## Family\n{family}\n")
    (docs / "notes" / "ada.md").write_text(f"# Ada Lovelace\n\n{shared}\n\n## Work\n{work}\n")
    run = cli(capsys)

    def held(folder):
        return sorted((p["title"], p["text"], p["source"]) for p in passages(folder))

    run("index", docs, "--out", index)
    assert [(p["id"], p["source"], p["text"]) for p in passages(index)] == [
        (0, "ada.md#0", shared), (1, "ada.md#1", family), (2, "notes/ada.md#1", work)]

    # ada.md taken out: both its passages stay, under again.md, which joins the record
    (docs / "ada.md").unlink()
    out, deleted = run("index", "--delete", "ada.md", "--into", index)
    assert deleted["removed"] == 0 and "2 of its passages are also in other documents: kept, under those" in out
    assert [(p["id"], p["source"]) for p in passages(index)] == [(0, "again.md#0"), (1, "again.md#1"), (2, "notes/ada.md#1")]
    manifest = json.loads((index / "manifest.json").read_text())
    assert sorted(manifest["documents"]["files"]) == ["again.md", "notes/ada.md"]

    # again.md drops the shared paragraph: notes/ada.md, unchanged, still holds it, so it stays, id and all
    (docs / "again.md").write_text(f"# Ada Lovelace\n\n## Family\n{family}\n")
    out, changed = run("index", "--add", docs, "--into", index)
    assert (changed["added"], changed["removed"]) == (0, 0)
    assert [(p["id"], p["source"]) for p in passages(index)] == [(0, "notes/ada.md#0"), (1, "again.md#0"), (2, "notes/ada.md#1")]

    # again.md out: the family leaves with it
    (docs / "again.md").unlink()
    out, deleted = run("index", "--delete", docs / "again.md", "--into", index)
    assert deleted["removed"] == 1
    run("index", docs, "--out", tmp_path / "fresh")
    assert held(index) == held(tmp_path / "fresh") == [("Ada Lovelace", shared, "notes/ada.md#0"), ("Ada Lovelace › Work", work, "notes/ada.md#1")]


def test_evaluate_reads_a_folder_and_finds_each_question_s_gold_passages_by_its_quotes(tmp_path, capsys):
    from pipeline.index.build import corpus_checksum

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ada.md").write_text("# Ada Lovelace\n\nAda Lovelace was a mathematician.\n\n## Family\nHer father was Lord Byron, the poet.\n")
    (docs / "babbage.txt").write_text("Charles Babbage\n\nBabbage was born in London in 1791.")
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps([
        {"id": "q1", "question": "Who was the father of Ada Lovelace?", "answer": "Lord Byron",
         "evidence": [{"file": "ada.md", "quote": "Her father was Lord\n Byron"}]},
        {"id": "q2", "question": "Where was Babbage born?", "answer": "London",
         "evidence": [{"file": "babbage.txt", "quote": "born in London"}, {"file": "babbage.txt", "quote": "He built the Difference Engine."}]}]))
    run = cli(capsys)
    out, summary = run("evaluate", "--questions", questions, "--corpus", docs, "--retriever", "dense", "--no-track", "--out", tmp_path / "results")
    assert f"{docs}: 2 files, 3 passages" in out
    assert (f"{questions}: 1 of 3 evidence quotes are in no passage of {docs}; recall leaves them out: "
            "q2: 'He built the Difference Engine.' (babbage.txt)") in out
    assert summary["retrievers"]["dense"]["recall@5"] == 100.0  # three passages: every gold one is in the top 5
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["data_sha256"]["corpus"] == corpus_checksum(read_folder(docs, log=lambda line: None).passages)
    predictions = json.loads((tmp_path / "results" / "predictions.json").read_text())["dense"]
    assert [row["gold_passages"] for row in predictions] == [[1], [2]]  # ada.md#1 (the family section), babbage.txt#0

    # the pages of the run check the folder as they check a corpus file: by what it reads as
    code = main(["pages", str(tmp_path / "results")])
    assert code == 2 and "no system of this run answered questions" in capsys.readouterr().err  # the check passed
    (docs / "babbage.txt").write_text("Charles Babbage\n\nBabbage was born in Marylebone in 1791.")
    code = main(["pages", str(tmp_path / "results")])
    assert code == 2 and f"{docs}: differs from the corpus {tmp_path / 'results'} was evaluated on (sha256 mismatch); no pages written" in capsys.readouterr().err


def test_fences_are_read_once_for_splitting_and_for_extracting():
    from modules.lm.checks import text_blocks, text_units

    text = "a\n```rust\n  x = 1\n\n```\nIt ends here. Then more\n```\ny"
    # a line outside a block alone; a block's lines as written, its fences and language dropped; an open one closed at the end
    assert list(text_blocks(text)) == [(False, ["a"]), (True, ["  x = 1", ""]), (False, ["It ends here. Then more"]), (True, ["y"])]
    assert text_units(text) == [("a", True), ("x = 1", True), ("It ends here.", True), ("Then more", False), ("y", True)]


def test_a_code_block_is_one_paragraph_that_keeps_its_lines_and_a_long_one_is_cut_at_lines():
    from pipeline.index.documents import paragraphs

    text = "Intro   line\nwrapped.\n\n```rust\nfn main() {\n\n    let x = 1;\n}\n```\nAfter.\n\n```\nopen"
    # prose closed up; the fence's language dropped, blank lines inside left out, indentation kept; an open block closed
    assert paragraphs(text) == ["Intro line wrapped.", "```\nfn main() {\n    let x = 1;\n}\n```", "After.", "```\nopen\n```"]
    assert paragraphs("Before.\n```\n\n```\nAfter.") == ["Before.", "After."]  # an empty block is no paragraph
    code = "```\n" + "\n".join(words(4, 4 * k) for k in range(5)) + "\n```"  # 20 words and two fences
    # 12 words a piece: two fences and two lines of 4 words (a third would make 14), then the next lines
    assert split_text(code, max_words=12, overlap=0) == ["```\n" + words(4) + "\n" + words(4, 4) + "\n```",
                                                        "```\n" + words(4, 8) + "\n" + words(4, 12) + "\n```",
                                                        "```\n" + words(4, 16) + "\n```"]


def test_a_line_that_introduces_the_next_paragraph_goes_into_its_passage():
    text = f"{words(5)}\n\nFor example:\n\n{words(8, 5)}"
    # 5 + 2 fit in 10, the 8 does not: "For example:" moves on with it (2 + 8 = 10)
    assert split_text(text, max_words=10, overlap=0) == [words(5), f"For example:\n{words(8, 5)}"]
    # alone in its passage it stays (nothing to leave behind)
    assert split_text(f"For example:\n\n{words(9, 5)}", max_words=10, overlap=0) == ["For example:", words(9, 5)]


def test_html_code_blocks_are_fenced_headings_nest_and_the_site_name_leaves_the_title(tmp_path):
    page = b"""<html><head><title>Rust 2015 - The Rust Edition Guide</title></head><body><main>
    <h1>Rust 2015</h1><p>For example:</p><pre><code>fn main() {
        println!("hi");
    }</code></pre><h2>Details</h2><p>One.</p><h3>Migration</h3><p>Two.</p><h2>Other</h2><p>Three.</p></main></body></html>"""
    title, sections = read_html(tmp_path / "rust-2015.html", page)
    assert title == "Rust 2015"  # the <h1> is the <title> without " - The Rust Edition Guide"
    assert [(s.heading, s.text) for s in sections] == [
        ("", 'For example:\n\n```\nfn main() {\n        println!("hi");\n    }\n```'),
        ("Details", "One."), ("Details › Migration", "Two."), ("Other", "Three.")]
    # a <title> that is not the <h1> and a site name keeps the <title>; the <h1> then heads the first section
    title, sections = read_html(tmp_path / "x.html", b"<title>Guide</title><h1>Start</h1><p>Text here.</p>")
    assert (title, sections[0].heading) == ("Guide", "Start")


def test_html_is_decoded_by_its_declared_charset_a_word_break_joins_its_word_and_an_xml_declaration_is_read(tmp_path):
    latin = '<html><head><meta charset="iso-8859-1"><title>Caf\xe9</title></head><body><p>Cr\xe8me br\xfbl\xe9e.</p></body></html>'
    assert read_html(tmp_path / "a.html", latin.encode("latin-1")) == ("Café", [Section("", "Crème brûlée.")])
    # no charset declared: UTF-8, else Windows-1252 (its curly quote is 0x92)
    assert read_html(tmp_path / "b.html", "<p>It’s here.</p>".encode())[1] == [Section("", "It’s here.")]
    assert read_html(tmp_path / "c.html", b"<p>It\x92s here.</p>")[1] == [Section("", "It’s here.")]
    # <wbr> marks where a long word may break: the word stays whole
    page = b'<?xml version="1.0" encoding="utf-8"?><html><body><p>Call <code>current_<wbr>dir</code> first.</p></body></html>'
    assert read_html(tmp_path / "d.html", page)[1] == [Section("", "Call current_dir first.")]


RUSTDOC_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><meta name="generator" content="rustdoc">
<title>var in std::env - Rust</title></head><body class="rustdoc fn"><nav class="sidebar"><h2><a href="#">var</a></h2>
<ul><li><a href="#errors">Errors</a></li></ul></nav><main><section id="main-content" class="content"><div class="main-heading">
<div class="rustdoc-breadcrumbs"><a href="../index.html">std</a>::<wbr><a href="index.html">env</a></div>
<h1>Function <span class="fn">var</span>&nbsp;<button id="copy-path" title="Copy item path to clipboard">Copy item path</button></h1>
<span class="sub-heading"><span class="since" title="Stable since Rust version 1.0.0">1.0.0</span> · <a class="src" href="x.html">Source</a> </span>
</div><pre class="rust item-decl"><code>pub fn var&lt;K: <a class="trait" href="t.html">AsRef</a>&lt;<a class="struct" href="s.html">OsStr</a>&gt;&gt;(key: K)</code></pre>
<details class="toggle top-doc" open><summary class="hideme"><span>Expand description</span></summary><div class="docblock">
<p>Fetches the environment variable <code>key</code> from the current process.</p>
<h2 id="errors"><a class="doc-anchor" href="#errors">§</a>Errors</h2><p>Returns <a href="e.html"><code>VarError::NotPresent</code></a> if it is not set.</p>
</div></details><h2 id="implementations" class="section-header">Implementations<a href="#implementations" class="anchor">§</a></h2>
<details class="toggle implementors-toggle" open><summary><section id="impl-Rc" class="impl"><a class="src rightside" href="s.html">Source</a>
<h3 class="code-header">impl&lt;T&gt; <a class="struct" href="r.html">Rc</a>&lt;T&gt;</h3></section></summary><div class="impl-items">
<details class="toggle method-toggle" open><summary><section id="method.new" class="method"><span class="rightside">
<span class="since" title="Stable since Rust version 1.0.0">1.0.0</span> · <a class="src" href="s.html">Source</a></span>
<h4 class="code-header">pub fn <a href="#method.new" class="fn">new</a>(value: T)</h4></section></summary>
<div class="docblock"><p>Constructs a new Rc. <a href="t.html#tymethod.x">Read more</a></p><div class="example-wrap"><a class="test-arrow" href="p">Run</a></div></div></details>
<section id="associatedtype.Output" class="associatedtype"><h4 class="code-header">type Output = <a href="r.html">Rc</a>&lt;T&gt;</h4></section></div></details>
<h2 id="modules" class="section-header">Modules<a href="#modules" class="anchor">§</a></h2><dl class="item-table"><dt><a class="mod" href="consts/index.html">consts</a></dt>
<dd>Constants associated with the current target</dd></dl>
<h2 id="blanket-implementations" class="section-header">Blanket Implementations<a href="#blanket" class="anchor">§</a></h2>
<div id="blanket-implementations-list"><p>Returns the argument unchanged.</p></div></section></main></body></html>"""


def test_a_rustdoc_page_is_read_without_its_furniture_and_titled_by_its_item(tmp_path):
    title, sections = read_html(tmp_path / "fn.var.html", RUSTDOC_PAGE.encode())
    assert title == "Function std::env::var"
    assert [(s.heading, s.text) for s in sections] == [
        ("", "Stable since Rust version 1.0.0\n\n```\npub fn var<K: AsRef<OsStr>>(key: K)\n```\n\n"
             "Fetches the environment variable key from the current process."),
        ("Errors", "Returns VarError::NotPresent if it is not set."),
        ("Implementations › impl<T> Rc<T> › pub fn new(value: T)", "Constructs a new Rc."),
        ("Implementations › impl<T> Rc<T> › type Output = Rc<T>", "type Output = Rc<T>"),  # no text under it: its heading is its line
        ("Modules", "consts: Constants associated with the current target"),
    ]
    # a source page: its path titles it, its line numbers go, its code stays as written
    source = (b'<html><head><meta name="generator" content="rustdoc"><title>env.rs - source</title></head><body class="rustdoc src">'
              b'<main><div class="main-heading"><h1><div class="sub-heading">std/</div>env.rs</h1></div><div class="example-wrap">'
              b'<pre class="rust"><code><a href=#1 id=1 data-nosnippet>1</a><span class="kw">use </span>x;\n'
              b'<a href=#2 id=2 data-nosnippet>2</a>fn f() {}</code></pre></div></main></body></html>')
    assert read_html(tmp_path / "env.rs.html", source) == ("Source std/env.rs", [Section("", "```\nuse x;\nfn f() {}\n```")])
    # the same furniture on a page another generator made is that page's text
    other = RUSTDOC_PAGE.replace('content="rustdoc"', 'content="mdBook"')
    assert "Expand description" in read_html(tmp_path / "fn.var.html", other.encode())[1][0].text


def test_a_page_that_asks_not_to_be_indexed_or_redirects_is_left_out_with_one_line(tmp_path):
    (tmp_path / "chapter.html").write_text("<title>Chapter</title><main><p>The chapter's own text is here.</p></main>")
    # mdBook's print.html: the whole book again, marked noindex; read, every passage would be there twice
    (tmp_path / "print.html").write_text('<head><meta name="ROBOTS" content="noindex"></head><main><p>The chapter\'s own text, '
                                         'cut elsewhere.</p></main>')
    # and a redirect stub
    (tmp_path / "old.html").write_text('<meta http-equiv="refresh" content="0; URL=chapter.html"><p>Redirecting to... chapter.html.</p>')
    lines = []
    corpus = read_folder(tmp_path, log=lines.append)
    assert [p.source for p in corpus.passages] == ["chapter.html#0"]
    assert any(line.endswith("print.html: skipped: the page asks not to be indexed (robots noindex)") for line in lines)
    assert any(line.endswith("old.html: skipped: the page redirects to another (meta refresh)") for line in lines)


def test_a_folder_read_again_parses_only_the_files_that_changed(tmp_path, capsys, monkeypatch):
    import pipeline.index.documents as documents

    docs, index, cache = tmp_path / "docs", tmp_path / "idx", tmp_path / "cache"
    docs.mkdir()
    shared = "Ada Lovelace was a mathematician."
    (docs / "ada.md").write_text(f"# Ada Lovelace\n\n{shared}\n\n## Family\nHer father was Lord Byron, the poet.\n")
    (docs / "again.md").write_text(f"# Ada Lovelace\n\n{shared}\n")  # repeats ada.md: skipped, but read
    (docs / "babbage.txt").write_text("Charles Babbage\n\nBabbage was born in London in 1791.")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    run = cli(capsys)
    run("index", docs, "--out", index, "--cache-dir", cache)
    parsed = []
    reader = documents.read_document
    monkeypatch.setattr(documents, "read_document", lambda path, *args: (parsed.append(path.name), reader(path, *args))[1])

    (docs / "babbage.txt").write_text("Charles Babbage\n\nBabbage was born in London in 1791. He designed the Analytical Engine.")
    out, changed = run("index", "--add", docs, "--into", index, "--cache-dir", cache)
    assert parsed == ["babbage.txt"] and (changed["added"], changed["removed"]) == (1, 1)
    assert "broken.pdf: skipped: not a readable PDF file" in out  # a file left out is left out again, and said so, unparsed
    for entry in (cache / "documents").rglob("*.json"):  # damaged entries: the files are read again
        entry.write_text("[[1]]")
    parsed.clear()
    out, again = run("index", "--add", docs, "--into", index, "--cache-dir", cache)
    assert sorted(parsed) == ["ada.md", "again.md", "babbage.txt", "broken.pdf"] and again["added"] == again["removed"] == 0

    parsed.clear()  # deleting ada.md reads the folder again to find who else holds its first passage: nothing is parsed
    out, deleted = run("index", "--delete", docs / "ada.md", "--into", index, "--cache-dir", cache)
    assert parsed == [] and "1 of its passages are also in other documents: kept, under those" in out
    (docs / "ada.md").unlink()
    run("index", docs, "--out", tmp_path / "fresh", "--cache-dir", tmp_path / "cache-fresh")
    assert sorted((p["title"], p["text"], p["source"]) for p in passages(index)) == \
        sorted((p["title"], p["text"], p["source"]) for p in passages(tmp_path / "fresh"))
    # another split is another reading: its files are parsed again, not taken from what the first reading kept
    parsed.clear()
    run("index", docs, "--out", tmp_path / "split", "--cache-dir", cache, "--passage-words", "60")
    assert sorted(parsed) == ["again.md", "babbage.txt", "broken.pdf"]
