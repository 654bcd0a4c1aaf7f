"""Evidence-chain pages and failure stages: the HTML is parsed back (standard library) and checked
for every hop, fact, citation, frontier link and gold mark; the stages are worked out by hand."""

from experiments.bench.check_pages import Rendered as Page  # the same reading of a page as the headless-browser check
from experiments.data import GoldHop, Question
from experiments.runs.failures import failure_stage, failure_summary, failure_table, write_pages
from pipeline.serve.pages import chain_page, page_name

TITLES = ["Jaws (film)", "Steven Spielberg", "Leah Adler", "Ohio River"]


def fact(fact_id, passage, text, score=0.5):
    return {"id": fact_id, "text": text, "passage": passage, "title": TITLES[passage], "cos": score, "struct": 1.0, "score": score}


RECORD = {
    "id": "q1", "question": "When did the mother of the director of <Jaws> die?", "answer": "2017", "em": 1.0, "f1": 1.0,
    "recall@5": 0.5, "passages": [0, 1, 3],
    "chain": [
        {"hop": 1, "sub_question": "Who directed Jaws?", "query": "Who directed Jaws?", "frontier_in": [],
         "facts": [fact(10, 0, "Jaws was directed by Steven Spielberg.", 0.9), fact(30, 3, "The Ohio River is a river.")],
         "answer": "Steven Spielberg", "supporting": [10]},
        {"hop": 2, "sub_question": "Who was the mother of #1?", "query": "Who was the mother of Steven Spielberg?", "frontier_in": [10],
         "facts": [fact(11, 1, "Steven Spielberg's mother was Leah Adler.", 0.8), fact(10, 0, "Jaws was directed by Steven Spielberg.")],
         "answer": "Leah Adler", "supporting": [11]},
    ],
    "fallbacks": ["answer 2: a note"],
}
GOLD = {"answer": "2017", "passages": [0, 1, 2], "steps": [("Who directed Jaws?", "Steven Spielberg"), ("Who was the mother of #1?", "Leah Adler")]}


def test_a_page_shows_every_hop_fact_citation_frontier_link_and_gold_mark():
    page = Page(chain_page(RECORD, TITLES, GOLD, system="hyperprove", stage=None, index="index.html"))
    text = " ".join(" ".join(page.text).split())
    assert "When did the mother of the director of <Jaws> die?" in text  # escaped, shown as written
    assert [i for i in page.ids if i.startswith("hop-") and "fact" not in i] == ["hop-1", "hop-2"]
    # each fact row once per hop; a fact shown again in a later hop gets its own id, links go to the first
    assert [i for i in page.ids if "fact" in i] == ["fact-10", "fact-30", "fact-11", "hop-2-fact-10"]
    assert page.classes["hop-answer"] == ["Steven Spielberg", "Leah Adler"]
    assert page.classes["cited-mark"] == ["cited", "cited"]
    # gold marks: facts of passages 0 and 1 (three rows), and the top passages 0 and 1; passage 2 was never reached
    assert page.classes["gold"].count("gold passage") == 3 + 2
    assert page.classes["missing"] == ["never reached"] and "Leah Adler (2): never reached" in text
    assert "gold step: Who was the mother of #1? → Leah Adler" in text
    assert "rewritten: Who was the mother of Steven Spielberg?" in text
    assert "starts from: fact 10 (hop 1)" in text and "carried to hop 2 : fact 10" in text
    internal = [link[1:] for link in page.links if link.startswith("#")]
    assert internal and all(target in page.ids for target in internal)  # every frontier and citation link lands
    assert "index.html" in page.links and page.classes["fallbacks"] == ["answer 2: a note"]
    assert page.classes["right"] == ["(right)"]


def test_a_page_without_gold_or_hops_still_reads():
    page = Page(chain_page({"question": "Where?", "answer": "Here", "passages": [3], "chain": []}, TITLES))
    text = " ".join(" ".join(page.text).split())
    assert "answer Here" in text and "Ohio River" in text and "gold" not in page.classes and "wrong" not in page.classes


QUESTION = Question(id="q1", question="When did the mother of the director of Jaws die?", answer="2017", gold_passages=(0, 1, 2),
                    decomposition=(GoldHop("Who directed Jaws?", "Steven Spielberg", 0), GoldHop("Who was the mother of #1?", "Leah Adler", 1),
                                   GoldHop("When did #2 die?", "2017", 2)))


def hops(*answers, facts_from=(0, 1, 2), first="Who directed Jaws?"):
    queries = [first, "Who was the mother of Steven Spielberg?", "When did Leah Adler die?"]
    return [{"sub_question": queries[k], "query": queries[k], "answer": a, "facts": [fact(k, facts_from[k], "x")]}
            for k, a in enumerate(answers)]


def test_a_wrong_answer_is_put_at_the_first_stage_that_failed():
    wrong = {"id": "q1", "em": 0.0, "f1": 0.0, "passages": []}
    assert failure_stage({**wrong, "em": 1.0}, QUESTION) is None
    # the first sub-question lost "Jaws", a word of the question that the first gold step names
    assert failure_stage({**wrong, "chain": hops("Steven Spielberg", "Leah Adler", "1999", first="Who directed it?")}, QUESTION) == "decomposition"
    # the passage of gold step 2 never came up, though its bridge was right: retrieval
    assert failure_stage({**wrong, "chain": hops("Steven Spielberg", "Leah Adler", "1999", facts_from=(0, 3, 2))}, QUESTION) == "retrieval"
    # every passage reached, but hop 2 answered someone else: the bridge to step 3 is lost
    assert failure_stage({**wrong, "chain": hops("Steven Spielberg", "Mary Smith", "1999")}, QUESTION) == "bridge"
    # a close enough hop answer (token F1 0.8 against "Leah Adler") carries the bridge; all held: the final reader
    assert failure_stage({**wrong, "chain": hops("Steven Spielberg", "Leah Posner Adler", "1999")}, QUESTION) == "final reader"
    # a question-only system: its top 5 passages are all it has; no bridge to check
    assert failure_stage({**wrong, "passages": [0, 1, 2, 3]}, QUESTION) == "final reader"
    assert failure_stage({**wrong, "passages": [0, 2, 3]}, QUESTION) == "retrieval"
    # without gold steps (HotpotQA) only whether every gold passage was reached
    plain = Question(id="q2", question="?", answer="x", gold_passages=(0, 1))
    assert failure_stage({**wrong, "id": "q2", "passages": [1, 0]}, plain) == "final reader"
    assert failure_stage({**wrong, "id": "q2", "passages": [1]}, plain) == "retrieval"


def test_the_failure_summary_counts_stages_and_links_two_examples_each():
    questions = [QUESTION] + [Question(id=f"p{k}", question="?", answer="x", gold_passages=(k,)) for k in range(3)]
    rows = [{"id": "q1", "em": 1.0, "f1": 1.0, "passages": [0]}] + [{"id": f"p{k}", "em": 0.0, "f1": 0.0, "passages": []} for k in range(3)]
    summary = failure_summary(rows, questions)
    assert summary["right"] == 1 and summary["retrieval"] == {"n": 3, "examples": ["p0", "p1"]}
    assert summary["bridge"] == {"n": 0, "examples": []}
    assert failure_summary([{"id": "q1", "recall@5": 1.0}], questions) == {}  # nothing answered: nothing to place
    table = failure_table([{"system": "dense", "failures": summary}], lambda system, i: f"pages/{system}/{page_name(i)}")
    assert "| dense | 1 | 0 | 3 | 0 | 0 |" in table
    assert "- dense: retrieval: [p0](pages/dense/p0.html), [p1](pages/dense/p1.html)" in table


def test_pages_are_written_per_system_with_indexes_wrong_answers_first(tmp_path):
    wrong = {**RECORD, "id": "q/2", "answer": "1999", "em": 0.0, "f1": 0.0}
    questions = [QUESTION, Question(id="q/2", question=QUESTION.question, answer="2017", gold_passages=(0, 1, 2),
                                    decomposition=QUESTION.decomposition)]
    written = write_pages(tmp_path / "pages", {"hyperprove": [RECORD, wrong], "ranked": [{"id": "q1", "passages": [0]}]}, questions, TITLES)
    assert written == 2 and sorted(p.name for p in (tmp_path / "pages" / "hyperprove").iterdir()) == ["index.html", "q1.html", "q_2.html"]
    assert not (tmp_path / "pages" / "ranked").exists()  # no answers, no pages
    index = Page((tmp_path / "pages" / "hyperprove" / "index.html").read_text())
    assert [link for link in index.links if link.endswith(".html")] == ["../index.html", "q_2.html", "q1.html"]  # the wrong one first
    # its gold step 3's passage (Leah Adler) was never reached
    assert "retrieval" in " ".join(index.text) and "stage" in " ".join(Page((tmp_path / "pages" / "hyperprove" / "q_2.html").read_text()).ids)
    top = Page((tmp_path / "pages" / "index.html").read_text())
    assert top.links[:1] == ["hyperprove/index.html"] and "50.0" in " ".join(top.text)
