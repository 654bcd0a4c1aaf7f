"""The LM extractor: per-passage cache, resume after an interruption, retry and fallback."""

import json

import pytest
from dspy.utils import DummyLM

from modules.facts import Fact, Passage
from pipeline.config import IndexConfig
from pipeline.index.build import build_index
from pipeline.index.extract import LMExtractor, SentenceExtractor, make_extractor

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
    # the retry is sampled warmer with its own seed, so that it draws the same sample when asked again
    assert (leah_calls[1]["kwargs"]["temperature"], leah_calls[1]["kwargs"]["seed"]) == (0.3, 1) and "seed" not in leah_calls[0]["kwargs"]
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
    from pipeline.index.extract import seed_extracted_facts, write_extracted_facts

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
    from pipeline.index.corpus import load_corpus
    from pipeline.index.extract import passage_digest, read_extracted_facts

    shipped = read_extracted_facts(DEMO_FACTS)
    passages = load_corpus(DEMO_DIR / "corpus.json")
    assert shipped["lm"] == LOCAL_MODEL_ID and shipped["extractor_version"] == LMExtractor.version
    assert [row["sha256"] for row in shipped["passages"]] == [passage_digest(p) for p in passages]
    assert all(row["facts"] for row in shipped["passages"])  # every passage extracted, none fell back to sentences


ENTITIES = {  # the LM names entities only; "Spielberg" is in no sentence as written, "Shark" in no passage
    "Jaws is a 1975 film.": {"entities": ["Jaws", "1975", "Steven Spielberg", "Spielberg's shark"]},
    "Leah Adler was a restaurateur.": {"entities": ["Leah Adler", "restaurateur"]},
    "The Ohio River flows": {"entities": ["Ohio River"]},
}


def test_lm_entities_makes_sentences_the_facts_and_names_their_entities(tmp_path, hash_embedder):
    from pipeline.index.extract import LMEntityExtractor

    lm = DummyLM(ENTITIES)
    ex = LMEntityExtractor(lm, "dummy/test", tmp_path / "cache", threads=1)
    facts = ex.extract(PASSAGES, first_id=5)
    # the second sentences' pronouns resolved by rule, as `sentences` does; an entity with a word the passage lacks is dropped
    assert facts[0] == [Fact("Jaws is a 1975 film.", ("Jaws", "1975"), 5), Fact("Jaws was directed by Steven Spielberg.", ("Jaws", "Steven Spielberg"), 5)]
    assert facts[1] == [Fact("Leah Adler was a restaurateur.", ("Leah Adler", "restaurateur"), 6), Fact("Leah Adler died in 2017.", ("Leah Adler",), 6)]
    # one sentence mentions the LM's "Ohio River" but not "Mississippi River": the LM's list is what counts
    assert facts[2] == [Fact("The Ohio River flows into the Mississippi River.", ("Ohio River",), 7)]
    assert [f.text for fs in facts for f in fs] == [f.text for k, p in enumerate(PASSAGES) for f in SentenceExtractor().extract_passage(p, k)]
    report = ex.report()
    assert (report["name"], report["extracted"], report["fallbacks"]) == ("lm-entities", 3, 0)
    assert "[[ ## facts ## ]]" not in lm.history[0]["messages"][-1]["content"]  # entities are all it asks for
    assert lm.history[0]["kwargs"]["max_tokens"] == 48 + len("Jaws (film)" + PASSAGES[0].text) // 12
    # its own cache, apart from the `lm` extractor's: a second run asks nothing, and `lm` would ask again
    again = LMEntityExtractor(DummyLM({}), "dummy/test", tmp_path / "cache")
    assert again.extract(PASSAGES, first_id=5) == facts and again.report()["cached"] == 3
    assert LMExtractor(DummyLM({}), "dummy/test", tmp_path / "cache").cache_dir != again.cache_dir
    index = build_index(PASSAGES, IndexConfig(extractor="lm-entities", embedder=hash_embedder.id), hash_embedder, progress=False, extractor=again)
    assert index.info["extractor"]["name"] == "lm-entities" and index.info["extractor"]["lm"] == "dummy/test"
    with pytest.raises(Exception, match="extractor 'lm-entities' needs an LM"):
        make_extractor("lm-entities")


def test_lm_entities_falls_back_to_rule_entities_for_a_sentence_that_names_none(tmp_path):
    from pipeline.index.extract import LMEntityExtractor

    ex = LMEntityExtractor(DummyLM({"Leah Adler was a restaurateur.": {"entities": ["restaurateur"]}}), "dummy/test", tmp_path / "cache")
    [facts] = ex.extract(PASSAGES[1:2])
    # the second sentence ("She" resolved) names no entity of the LM's: the rules name "Leah Adler" and "2017" (`sentences`)
    assert facts == [Fact("Leah Adler was a restaurateur.", ("restaurateur",), 0), Fact("Leah Adler died in 2017.", ("Leah Adler", "2017"), 0)]


def test_the_extraction_benchmark_counts_calls_facts_and_entities_with_nothing_cached(tmp_path):
    from experiments.bench.extract import measure_extraction
    from modules.errors import HyperProveError

    (tmp_path / "corpus.json").write_text(json.dumps([{"title": p.title, "text": p.text} for p in PASSAGES]))
    figures = measure_extraction(str(tmp_path / "corpus.json"), 2, "lm-entities", {}, model=DummyLM(ENTITIES))
    # two passages, one call each; 4 sentences with 2, 2, 2 and 1 entities (see the lm-entities test above)
    assert (figures["passages"], figures["lm_calls_per_passage"], figures["facts_per_passage"], figures["entities_per_fact"]) == (2, 1.0, 2.0, 1.75)
    assert (figures["fallbacks"], figures["retried"], figures["characters_per_passage"]) == (0, 0, round((56 + 48) / 2))
    again = measure_extraction(str(tmp_path / "corpus.json"), 2, "lm-entities", {}, model=DummyLM(ENTITIES))
    assert again["lm_calls_per_passage"] == 1.0  # a fresh cache each time: nothing is served from a previous run
    with pytest.raises(HyperProveError, match="only the LM extractors"):
        measure_extraction(str(tmp_path / "corpus.json"), 2, "sentences", {})
