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
