"""Comparison and same-country questions decided by rule from hand-made chains."""

import pytest

from modules.lm.countries import countries_named
from modules.lm.question_types import comparison_of, date_value, decide, number_value, question_type, rule_answer


def chain(*hops):
    """Hops as (sub-question, answer); "#k" filled with answer k as the bridges-by-rule rewrite does."""
    answers, built = [], []
    for number, (sub_question, answer) in enumerate(hops, start=1):
        query = sub_question
        for k, earlier in enumerate(answers, start=1):
            query = query.replace(f"#{k}", earlier)
        built.append({"hop": number, "sub_question": sub_question, "query": query, "answer": answer})
        answers.append(answer)
    return built


@pytest.mark.parametrize("text, value", [
    ("29 February 1944", (1944, 2, 29)),
    ("January 3, 1960", (1960, 1, 3)),
    ("January 1963", (1963, 1, None)),
    ("1952", (1952, None, None)),
    ("released in 1952 in France", (1952, None, None)),
    ("11 June", None),  # no year
    ("1970s", None),
    ("born 1901, died 1950", None),  # two dates: which one is asked is not known
    ("unknown", None),
])
def test_date_value(text, value):
    assert date_value(text) == value


@pytest.mark.parametrize("text, value", [("104 minutes", 104.0), ("12,000", 12000.0), ("3.5 km", 3.5), ("54 in 1990", None), ("aged 54 on 3 May 1990", 54.0), ("none", None), ("5 or 6", None)])
def test_number_value(text, value):
    assert number_value(text) == value


@pytest.mark.parametrize("question, kind", [
    ("Which film came out first, Sudden Fear or The Adventurer Of Chad?", "comparison"),
    ("Which film has the director who died later, Love, Honor And Oh-Baby! or I Cover The Underworld?", "comparison"),
    ("Who lived longer, Ludwig Elsbett or Pamela Ann Rymer?", "comparison"),
    ("Are both movies, Naked Tango and Algiers (Film), from the same country?", "equality"),
    ("Do both films A Trial In Prague and Three Strangers have the directors that share the same nationality?", "equality"),
    ("Are Random House Tower and 888 7th Avenue both used for real estate?", "equality"),
    ("Who played in Soulfly, Max Cavalera or Billy Idol?", "choice"),
    ("When did the mother of the director of Jaws die?", "other"),
])
def test_question_type(question, kind):
    assert question_type(question) == kind


def test_the_words_of_the_options_do_not_set_the_order():
    comparison = comparison_of("Which film came out first, After Hours or Before Sunrise?")
    assert comparison.options == ("After Hours", "Before Sunrise") and comparison.most is False
    assert comparison_of("Which film was released more recently, Die Mutter or Naked?").most is True
    assert comparison_of("Which film is longer, Jaws or Duel?").measure == "number"
    assert comparison_of("Who played in Soulfly, Max Cavalera or Billy Idol?") is None  # a choice, no order


def test_an_earlier_date_wins_first():
    question = "Which film came out first, Girl From Hong Kong or Forces Occultes?"
    decision = rule_answer(question, chain(("When did Girl From Hong Kong come out?", "1961"), ("When did Forces Occultes come out?", "1943")))
    assert decision.answer == "Forces Occultes"
    assert decision.how == "Girl From Hong Kong (1961) > Forces Occultes (1943), the lesser wins"


def test_a_bridge_comparison_follows_each_option_through_its_bridge():
    # hops 3 and 4 hold the values; "#1" and "#2" tie them to the option their bridge was asked about
    question = "Which film has the director who died earlier, The Hitler Gang or Flannelfoot?"
    hops = chain(("Who directed The Hitler Gang?", "John Farrow"), ("Who directed Flannelfoot?", "Maclean Rogers"),
                 ("When did #1 die?", "January 1963"), ("When did #2 die?", "1962"))
    assert rule_answer(question, hops).answer == "Flannelfoot"
    # the same with the bridges written out, no "#k": the query naming the earlier answer ties them
    written = chain(("Who directed The Hitler Gang?", "John Farrow"), ("Who directed Flannelfoot?", "Maclean Rogers"),
                    ("When did Maclean Rogers die?", "1962"), ("When did John Farrow die?", "January 1963"))
    assert rule_answer(question, written).answer == "Flannelfoot"
    later = rule_answer(question.replace("earlier", "later"), hops)
    assert later.answer == "The Hitler Gang"


def test_what_the_rule_cannot_tell_it_leaves_to_the_reader_with_the_reason():
    question = "Which film came out first, Jaws or Duel?"
    same_year = rule_answer(question, chain(("When did Jaws come out?", "1975"), ("When did Duel come out?", "March 1975")))
    assert same_year.answer is None and same_year.how == "'Jaws' (1975) and 'Duel' (1975-3) cannot be told apart"
    no_date = rule_answer(question, chain(("When did Jaws come out?", "1975"), ("When did Duel come out?", "unknown")))
    assert no_date.answer is None and no_date.how == "no date in 'unknown'"
    # one hop that asks the comparison itself: it belongs to both options, so neither has a value
    asked_whole = rule_answer(question, chain((question, "Duel")))
    assert asked_whole.answer is None and asked_whole.how == "no hop answers for 'Jaws'"
    assert rule_answer("When did the director of Jaws die?", chain(("Who directed Jaws?", "Steven Spielberg"))) is None


def test_older_takes_the_earlier_birth_date_or_the_greater_age():
    question = "Who is older, Georg Wenker or Ida Turay?"
    born = chain(("When was Georg Wenker born?", "25 January 1852"), ("When was Ida Turay born?", "28 October 1907"))
    assert rule_answer(question, born).answer == "Georg Wenker"
    # identity steps first, then ages: the identities are not leaves (their answers are named by the next queries)
    ages = chain(("Who is Georg Wenker?", "Georg Wenker"), ("Who is Ida Turay?", "Ida Turay"),
                 ("How old was Georg Wenker when he died?", "59"), ("How old was Ida Turay when she died?", "89"))
    assert rule_answer(question, ages).answer == "Ida Turay"
    assert rule_answer(question.replace("older", "younger"), born).answer == "Ida Turay"


def test_lived_longer_takes_the_years_between_birth_and_death():
    question = "Who lived longer, Ludwig Elsbett or Pamela Ann Rymer?"
    hops = chain(("When was Ludwig Elsbett born?", "November 8, 1913"), ("When did Ludwig Elsbett die?", "March 28, 2003"),
                 ("When was Pamela Ann Rymer born?", "January 16, 1941"), ("When did Pamela Ann Rymer die?", "September 21, 2011"))
    decision = rule_answer(question, hops)
    assert decision.answer == "Ludwig Elsbett"  # 89.4 years against 70.7
    years_only = chain(("When was Ludwig Elsbett born?", "1913"), ("When did Ludwig Elsbett die?", "2003"),
                       ("When was Pamela Ann Rymer born?", "1941"), ("When did Pamela Ann Rymer die?", "2011"))
    assert rule_answer(question, years_only).how == "the years 'Ludwig Elsbett' lived are not exact to the day"


def test_a_number_comparison():
    hops = chain(("How long is Jaws?", "124 minutes"), ("How long is Duel?", "90 minutes"))
    assert rule_answer("Which film is longer, Jaws or Duel?", hops).answer == "Jaws"
    assert rule_answer("Which film is shorter, Jaws or Duel?", hops).answer == "Duel"


def test_an_option_with_a_comma_stays_whole():
    question = "Which film has the director who died later, Love, Honor And Oh-Baby! or I Cover The Underworld?"
    hops = chain(("Who directed Love, Honor And Oh-Baby!?", "Charles Lamont"), ("Who directed I Cover The Underworld?", "R. G. Springsteen"),
                 ("When did #1 die?", "September 12, 1993"), ("When did #2 die?", "December 9, 1989"))
    assert rule_answer(question, hops).answer == "Love, Honor And Oh-Baby!"


@pytest.mark.parametrize("first, second, answer", [
    ("Canadian", "Egypt", "no"),
    ("Greek- American", "United States", "yes"),  # two nationalities, one shared
    ("British", "English", "yes"),
    ("Hamar, Norway", "Norwegian", "yes"),
    ("Trondheim", "Norway", None),  # a city the table does not know: the reader answers
])
def test_same_country_by_the_countries_the_answers_name(first, second, answer):
    question = "Are the directors of films C-Man (Film) and Greencastle (Film) both from the same country?"
    hops = chain(("Who directed C-Man (Film)?", "Joseph Lerner"), ("Who directed Greencastle (Film)?", "Koran Dunbar"),
                 ("What country is #1 from?", first), ("What country is #2 from?", second))
    assert rule_answer(question, hops).answer == answer


def test_same_country_needs_exactly_the_two_compared_answers():
    question = "Are Marufabad and Nasamkhrali both located in the same country?"
    one = decide(comparison_of(question), chain(("Are Marufabad and Nasamkhrali in the same country?", "yes")))
    assert one.answer is None and one.how == "the chain ends in 1 answers, not the 2 compared"


@pytest.mark.parametrize("text, countries", [
    ("American", {"United States"}), ("New Mexico", {"United States"}), ("Mexican", {"Mexico"}),
    ("North Korean", {"North Korea"}), ("South American", set()), ("us", set()), ("U.S.", {"United States"}),
    ("Soviet-born Russian", {"Soviet Union", "Russia"}), ("NASCAR", set()),
])
def test_countries_named(text, countries):
    assert countries_named(text) == countries


@pytest.mark.parametrize("question, plan", [
    ("Which film came out first, Sudden Fear or The Adventurer Of Chad?",
     ["When did Sudden Fear come out?", "When did The Adventurer Of Chad come out?"]),
    ("Which women's magazine was published first, Mirabella or Home Monthly?",
     ["When was Mirabella published?", "When was Home Monthly published?"]),
    ("Which film whose director is younger, Forbidden Ground or Free Guy?",
     ["Who is the director of Forbidden Ground?", "Who is the director of Free Guy?", "When was #1 born?", "When was #2 born?"]),
    ("Who lived longer, Ludwig Elsbett or Pamela Ann Rymer?",
     ["When was Ludwig Elsbett born?", "When did Ludwig Elsbett die?", "When was Pamela Ann Rymer born?", "When did Pamela Ann Rymer die?"]),
    ("Are both movies, Naked Tango and Algiers (Film), from the same country?",
     ["Which country is Naked Tango from?", "Which country is Algiers (Film) from?"]),
    ("Are Wiqu (Lima) and Qillqa (Melgar) both located in the same country?",
     ["Which country is Wiqu (Lima) located in?", "Which country is Qillqa (Melgar) located in?"]),
    ("Are director of film Garbo (Film) and director of film Souls At Sea both from the same country?",
     ["Who is the director of Garbo (Film)?", "Who is the director of Souls At Sea?", "Which country is #1 from?", "Which country is #2 from?"]),
    ("Do both films Rip, Sew And Stitch and Clown Princes have the directors from the same country?",
     ["Who is the director of Rip, Sew And Stitch?", "Who is the director of Clown Princes?", "Which country is #1 from?", "Which country is #2 from?"]),
    ("Does Leslie Pietrzyk have the same nationality as Marianne Wiggins?",
     ["What is the nationality of Leslie Pietrzyk?", "What is the nationality of Marianne Wiggins?"]),
    ("Are Christopher Newton (Criminal) and Frances M. Vega of the same nationality?",
     ["What is the nationality of Christopher Newton (Criminal)?", "What is the nationality of Frances M. Vega?"]),
    ("Which film has the director who is older, A Better Tomorrow Iii: Love & Death In Saigon or Har Dil Jo Pyar Karega?",
     ["Who is the director of A Better Tomorrow Iii: Love & Death In Saigon?", "Who is the director of Har Dil Jo Pyar Karega?",
      "When was #1 born?", "When was #2 born?"]),  # the "Death" of a title asks for no death date
    ("Which mountain is taller, Gasherbrum II or Langtang Ri?", None),  # a number a rule cannot word the question for
    ("Were both Pietro Salini and Domenico Ravenna, born in the same place?", None),  # not a country
    ("Who played in Soulfly, Max Cavalera or Billy Idol?", None),
    ("When did the mother of the director of Jaws die?", None),
])
def test_comparison_plan(question, plan):
    from modules.lm.question_types import comparison_plan

    assert comparison_plan(question) == plan


def test_both_is_no_when_a_hop_says_no_and_yes_when_every_one_of_two_says_yes():
    question = "Are both Adolfo Bioy Casares and James Norman Hall Argentinian authors?"
    split = chain(("Is Adolfo Bioy Casares an Argentinian author?", "Yes"), ("Is James Norman Hall an Argentinian author?", "No."))
    assert rule_answer(question, split) is None  # the rule is asked for
    assert rule_answer(question, split, both=True).answer == "no"
    assert rule_answer(question, split, both=True).how == "both: the hops answered yes, no."
    agreed = chain(("Is Cypress a genus?", "Yes"), ("Is Ajuga a genus?", "yes"))
    assert rule_answer("Are Cypress and Ajuga both genera?", agreed, both=True).answer == "yes"
    # one yes/no answer (the hop that asked the whole question), a question without "both", a same-country one: no decision
    whole = chain(("Who is Ian Brown?", "Ian George Brown"), ("Who is Dee Snider?", "Dee Snider"), ("Are both #1 and #2 actors?", "Yes"))
    assert rule_answer("Are Ian Brown and Dee Snider both actors?", whole, both=True) is None
    assert rule_answer("Are Cypress and Ajuga genera?", agreed, both=True) is None
    assert rule_answer("Which is both a genus and a tree, Cypress or Ajuga?", agreed, both=True) is None  # asks no yes or no
    countries = chain(("Which country is A from?", "yes"), ("Which country is B from?", "no"))
    assert rule_answer("Are both A and B from the same country?", countries, both=True).how == "no country in 'yes'"


def test_a_question_that_names_a_nationality_without_asking_yes_or_no_is_no_equality():
    question = "Who was a host of Who Wants to be a Millionaire who shares the same nationality as the author of The Feminine Mystique?"
    assert question_type(question) == "other" and comparison_of(question) is None
    hops = chain(("Who is the author of The Feminine Mystique?", "Betty Friedan"), ("What is the nationality of #1?", "American"),
                 ("Who hosted Who Wants to be a Millionaire?", "Chris Harrison"))
    assert rule_answer(question, hops) is None


def test_only_hops_that_ask_for_the_compared_event_count():
    # "born first" compared with the years the directors made films would name the wrong film
    question = "Which film has the director who was born first, Tombstone Rashomon or Waiting For The Clouds?"
    hops = chain(("Who directed Tombstone Rashomon?", "Alex Cox"), ("Who directed Waiting For The Clouds?", "Yeşim Ustaoğlu"),
                 ("When did #1 direct their film?", "2012"), ("When did #2 direct their film?", "1919"))
    decision = rule_answer(question, hops)
    assert decision.answer is None and decision.how == "no hop asks when 'Tombstone Rashomon' was born"
    assert comparison_of(question).event == "born" and comparison_of("Who died first, Jules White or George Sidney?").event == "died"
    assert comparison_of("Which film came out first, Jaws or Duel?").event is None


