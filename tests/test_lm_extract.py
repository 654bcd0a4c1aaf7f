"""The LM extractor: per-passage cache, resume after an interruption, retry and fallback."""

import json

import pytest
from dspy.utils import DummyLM

from modules.facts import Fact, Passage
from pipeline.config import IndexConfig
from pipeline.extract import LMExtractor, SentenceExtractor, make_extractor
from pipeline.index import build_index

PASSAGES = [
    Passage("Jaws (film)", "Jaws is a 1975 film. It was directed by Steven Spielberg."),
    Passage("Leah Adler", "Leah Adler was a restaurateur. She died in 2017."),
    Passage("Ohio River", "The Ohio River flows into the Mississippi River."),
]
GOOD = {
    "Jaws is a 1975 film.": {"entities": ["Jaws", "1975", "Steven Spielberg"], "facts": ["Jaws is a 1975 film.", "Jaws was directed by Steven Spielberg."]},
    "Leah Adler was a restaurateur.": {"entities": ["Leah Adler", "2017"], "facts": ["Leah Adler was a restaurateur.", "Leah Adler died in 2017."]},
    "The Ohio River flows": {"entities": ["Ohio River", "Mississippi River"], "facts": ["The Ohio River flows into the Mississippi River."]},
}


def extractor(tmp_path, answers, threads=2) -> LMExtractor:
    return LMExtractor(DummyLM(answers), "dummy/test", tmp_path / "cache", threads=threads)


def test_facts_come_from_the_lm_with_their_entities(tmp_path):
    ex = extractor(tmp_path, GOOD)
    facts = ex.extract(PASSAGES, first_id=5)
    assert facts[0] == [
        Fact("Jaws is a 1975 film.", ("Jaws", "1975"), 5),
        Fact("Jaws was directed by Steven Spielberg.", ("Jaws", "Steven Spielberg"), 5),
    ]
    assert facts[2] == [Fact("The Ohio River flows into the Mississippi River.", ("Ohio River", "Mississippi River"), 7)]
    report = ex.report()
    assert report.pop("lm_seconds") >= 0
    assert report == {"name": "lm", "version": "1", "lm": "dummy/test", "passages": 3, "cached": 0, "extracted": 3, "retried": 0, "fallbacks": 0}


class Interrupting(DummyLM):
    """Answers the first passage, then the user presses Ctrl-C."""

    def forward(self, prompt=None, messages=None, **kwargs):
        if "Jaws is a 1975 film." not in messages[-1]["content"]:
            raise KeyboardInterrupt
        return super().forward(prompt=prompt, messages=messages, **kwargs)


def test_an_interrupted_extraction_resumes_from_the_cache(tmp_path):
    first = LMExtractor(Interrupting(GOOD), "dummy/test", tmp_path / "cache", threads=1)
    with pytest.raises(KeyboardInterrupt):
        first.extract(PASSAGES)
    cached = list((tmp_path / "cache" / "extractions").rglob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())[1]["text"] == "Jaws was directed by Steven Spielberg."
    # The second run knows nothing about Jaws: that passage must come from the cache.
    rest = {k: v for k, v in GOOD.items() if not k.startswith("Jaws")}
    second = extractor(tmp_path, rest)
    facts = second.extract(PASSAGES)
    assert facts[0][1].text == "Jaws was directed by Steven Spielberg."
    assert second.report()["cached"] == 1 and second.report()["extracted"] == 2
    assert len(second.lm.history) == 2


def test_the_cache_is_per_lm_and_version(tmp_path):
    extractor(tmp_path, GOOD).extract(PASSAGES[:1])
    other = LMExtractor(DummyLM(GOOD), "dummy/other", tmp_path / "cache")
    other.extract(PASSAGES[:1])
    assert other.report()["cached"] == 0


def test_malformed_output_is_retried_once_then_falls_back_to_sentences(tmp_path):
    answers = dict(GOOD)
    answers["Leah Adler was a restaurateur."] = {"entities": ["Leah Adler"], "facts": []}
    ex = extractor(tmp_path, answers, threads=1)
    facts = ex.extract(PASSAGES)
    assert facts[1] == SentenceExtractor().extract_passage(PASSAGES[1], 1)
    assert ex.report()["fallbacks"] == 1 and ex.report()["retried"] == 1 and ex.report()["extracted"] == 2
    assert ex.fallback_titles == ["Leah Adler"]
    leah_calls = [h for h in ex.lm.history if "Leah Adler was a restaurateur." in h["messages"][-1]["content"]]
    assert len(leah_calls) == 2 and leah_calls[1]["kwargs"]["rollout_id"] == 1
    # a fallback is not cached: the next build asks the LM again
    again = extractor(tmp_path, GOOD)
    again.extract(PASSAGES)
    assert again.report()["cached"] == 2 and again.report()["fallbacks"] == 0


def test_a_fact_without_listed_entities_gets_rule_entities(tmp_path):
    answers = {"Jaws is a 1975 film.": {"entities": ["Universal"], "facts": ["Jaws was directed by Steven Spielberg."]}}
    facts = extractor(tmp_path, answers).extract(PASSAGES[:1])
    assert facts[0][0].entities == ("Jaws", "Steven Spielberg")


def test_the_index_manifest_records_the_lm_extraction(tmp_path, hash_embedder):
    ex = extractor(tmp_path, GOOD)
    index = build_index(PASSAGES, IndexConfig(extractor="lm", embedder=hash_embedder.id), hash_embedder, progress=False, extractor=ex)
    assert index.info["extractor"]["lm"] == "dummy/test" and index.info["extractor"]["fallbacks"] == 0
    assert index.fact_text[1] == "Jaws was directed by Steven Spielberg."
    with pytest.raises(Exception, match="needs an LM"):
        make_extractor("lm")


def test_shipped_facts_seed_the_cache_of_the_lm_that_made_them_and_no_other(tmp_path):
    from modules.errors import HyperProveError
    from pipeline.extract import seed_extracted_facts, write_extracted_facts

    extractor(tmp_path, GOOD).extract(PASSAGES)
    shipped = write_extracted_facts(tmp_path / "facts.json", PASSAGES, tmp_path / "cache", "dummy/test")
    assert [row["title"] for row in shipped["passages"]] == ["Jaws (film)", "Leah Adler", "Ohio River"]
    assert shipped["passages"][1]["facts"][1] == {"text": "Leah Adler died in 2017.", "entities": ["Leah Adler", "2017"]}
    # A fresh cache, an LM that knows nothing: every passage comes from the shipped file.
    changed = [*PASSAGES[:2], Passage("Ohio River", "The Ohio River is long.")]  # not what the file was made from
    assert seed_extracted_facts(tmp_path / "facts.json", changed, tmp_path / "fresh", "dummy/other") == 0  # another LM
    assert seed_extracted_facts(tmp_path / "facts.json", changed, tmp_path / "fresh", "dummy/test") == 2
    assert seed_extracted_facts(tmp_path / "facts.json", changed, tmp_path / "fresh", "dummy/test") == 0  # already there
    fresh = LMExtractor(DummyLM({"The Ohio River is long.": {"entities": ["Ohio River"], "facts": ["The Ohio River is long."]}}),
                        "dummy/test", tmp_path / "fresh", threads=1)
    facts = fresh.extract(changed)
    assert facts[1][1] == Fact("Leah Adler died in 2017.", ("Leah Adler", "2017"), 1)
    assert fresh.report()["cached"] == 2 and len(fresh.lm.history) == 1
    # A passage the LM could not extract has nothing to ship; a damaged file is one line.
    with pytest.raises(HyperProveError, match="passage 'Ohio River' has no LM extraction"):
        write_extracted_facts(tmp_path / "more.json", PASSAGES, tmp_path / "fresh", "dummy/test")
    (tmp_path / "bad.json").write_text(json.dumps({"format": "hyperprove-lm-facts", "passages": [{"sha256": "x"}]}))
    with pytest.raises(HyperProveError, match=r"bad.json: passages\[0\] needs sha256 and facts"):
        seed_extracted_facts(tmp_path / "bad.json", PASSAGES, tmp_path / "fresh", "dummy/test")


def test_the_shipped_demo_facts_match_the_demo_corpus_and_the_embedded_model():
    """`hyperprove demo --write-facts` made experiments/demo/facts.json from these very passages."""
    from experiments.demonstration import DEMO_DIR, DEMO_FACTS
    from pipeline.config import LOCAL_MODEL_ID
    from pipeline.corpus import load_corpus
    from pipeline.extract import passage_digest, read_extracted_facts

    shipped = read_extracted_facts(DEMO_FACTS)
    passages = load_corpus(DEMO_DIR / "corpus.json")
    assert shipped["lm"] == LOCAL_MODEL_ID and shipped["extractor_version"] == LMExtractor.version
    assert [row["sha256"] for row in shipped["passages"]] == [passage_digest(p) for p in passages]
    assert all(row["facts"] for row in shipped["passages"])  # every passage extracted, none fell back to sentences
