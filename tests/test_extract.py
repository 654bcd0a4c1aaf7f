"""The rule-based `sentences` extractor, rule by rule."""

import pytest

from modules.errors import HyperProveError
from modules.facts import Fact, Passage
from modules.lm.checks import find_entities, resolve_pronoun, split_sentences, subject_name
from pipeline.index.extract import SentenceExtractor, make_extractor


def test_split_sentences_keeps_abbreviations_and_initials():
    text = 'Dr. J. R. R. Tolkien wrote it in 1937. It sold well! "Why?" Nobody asked. St. Paul is a city.'
    assert split_sentences(text) == [
        "Dr. J. R. R. Tolkien wrote it in 1937.",
        "It sold well!",
        '"Why?"',
        "Nobody asked.",
        "St. Paul is a city.",
    ]


def test_pronouns_resolve_to_the_title_without_its_parenthetical():
    assert subject_name("Jaws (film)") == "Jaws"
    assert resolve_pronoun("It was released in 1975.", "Jaws") == ("Jaws was released in 1975.", True)
    assert resolve_pronoun("His mother died.", "Steven Spielberg") == ("Steven Spielberg's mother died.", True)
    assert resolve_pronoun("Ithaca is a town.", "X") == ("Ithaca is a town.", False)


def test_entities_title_spans_dates_and_numbers():
    sentence = "Jaws was directed by Steven Spielberg on 20 June 1975 and earned 470,700,000 dollars in 3 weeks."
    assert find_entities(sentence, "Jaws") == ["Jaws", "Steven Spielberg", "20 June 1975", "470,700,000"]
    # a lone sentence-initial function word is not an entity; era markers stay with their year
    assert find_entities("The empire collapsed in 330 BC after the Battle of Gaugamela.", "Iran") == ["330 BC", "Battle of Gaugamela"]


def test_extractor_resolves_pronouns_after_the_first_sentence_only():
    passage = Passage("Steven Spielberg", "He is a director. He directed Jaws in 1975.")
    facts = SentenceExtractor().extract([passage], first_id=7)[0]
    assert facts == [
        Fact("He is a director.", (), 7),
        Fact("Steven Spielberg directed Jaws in 1975.", ("Steven Spielberg", "Jaws", "1975"), 7),
    ]


def test_empty_passage_becomes_its_title():
    assert SentenceExtractor().extract([Passage("Lonely Title", "")])[0] == [Fact("Lonely Title", ("Lonely Title",), 0)]


def test_unknown_extractor_is_a_one_line_error():
    with pytest.raises(HyperProveError, match="unknown extractor 'magic'"):
        make_extractor("magic")


def test_line_rules_keep_code_whole_join_introductions_and_leave_no_fragment():
    from modules.lm.checks import document_sentences

    text = ("Closures now capture less. For example:\n```\nfn main() {\n    let x = 1; // One. Two.\n}\n```\n"
            "Congrats!\nThis ends. Done!\nClone\nIf all captured values are Clone.")
    assert document_sentences(text) == [
        "Closures now capture less.",
        "For example: fn main() { let x = 1; // One. Two. }",  # the code block whole, with the line that introduces it
        "Congrats! This ends. Done!",  # short and first on its line: with the next; short after a sentence: with it
        "Clone If all captured values are Clone.",  # a term on its own line, with its definition
    ]
    assert document_sentences("Short one.") == ["Short one."]  # nothing to join: kept
    # a Wikipedia passage is one line: its sentences as before, unless one is a fragment or introduces the next
    assert document_sentences("He was born in 1950. He was a poet of note.") == split_sentences("He was born in 1950. He was a poet of note.")
    assert document_sentences("He was born in 1950. Works include:") == ["He was born in 1950. Works include:"]  # nothing follows it


def test_the_line_rules_leave_contractions_and_use_the_page_for_subject():
    assert resolve_pronoun("It’s identical.", "Prelude") == ("Prelude’s identical.", True)  # the old reading, kept for records
    assert resolve_pronoun("It’s identical.", "Prelude", contractions=False) == ("It’s identical.", False)
    passage = Passage("Rust 2015 › Details", "Rust 2015 is the first edition.\nIt commenced with 1.0.\nIt’s the default.")
    texts = [fact.text for fact in SentenceExtractor(rules=2).extract_passage(passage, 0)]
    assert texts == ["Rust 2015 is the first edition.", "Rust 2015 commenced with 1.0.", "It’s the default."]
    old = [fact.text for fact in SentenceExtractor(rules=1).extract_passage(passage, 0)]
    assert old == ["Rust 2015 is the first edition.", "Rust 2015 › Details commenced with 1.0.", "Rust 2015 › Details’s the default."]
    assert SentenceExtractor(rules=2).report() == {"name": "sentences", "version": "1", "rules": 2}
    assert SentenceExtractor(rules=1).report() == {"name": "sentences", "version": "1"}  # as indexes built before the rules recorded it
