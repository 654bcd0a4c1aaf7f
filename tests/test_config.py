"""The one configuration object: sections, validation, overrides, round trip."""

import json
import re

import pytest

from experiments.data import Question
from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig, ProgramConfig


def test_round_trip_and_overrides(tmp_path):
    config = HyperProveConfig().with_overrides(retriever={"alpha": 0.5, "theta": None}, lm={"model": "openai/gpt-4o-mini"},
                                               program={"max_hops": 3}, cache_dir="/tmp/c")
    assert (config.retriever.alpha, config.retriever.theta) == (0.5, 0.05)  # None leaves the default
    assert config.lm.id == "openai/gpt-4o-mini" and config.program.max_hops == 3 and config.cache_dir == "/tmp/c"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    assert HyperProveConfig.from_file(path, trusted=True) == config


@pytest.mark.parametrize("values, message", [
    ({"lm": {"modle": "x"}}, "config: lm config: unknown field 'modle' \\(known: model, temperature"),
    ({"program": {"carry": "all"}}, "carry='all' must be 'supporting' or 'top_k'"),
    ({"index": {"extractor": "magic"}}, "extractor='magic' must be one of 'sentences', 'lm', 'lm-entities'"),
    ({"lm": "openai/gpt-4o-mini"}, "config: lm must be a JSON object"),
    ({"retrievr": {}}, "unknown field 'retrievr'"),
    ({"evaluation": {"decomposition": "oracle"}}, "decomposition='oracle' must be 'gold' or 'lm'"),
    ({"evaluation": {"limit": 0}}, r"limit=0 must lie in \[1, 1000000000\]"),
])
def test_bad_fields_are_named(values, message):
    with pytest.raises(HyperProveError, match=message):
        HyperProveConfig.from_dict(values)


def test_every_shipped_experiment_config_loads_and_names_its_own_results_folder():
    import json
    from pathlib import Path

    from experiments.harness import parse_systems

    paths = sorted((Path(__file__).resolve().parents[1] / "experiments" / "configs").glob("*.json"))
    configs, retired = {}, []
    for path in paths:
        try:
            configs[path.stem] = (HyperProveConfig.from_file(path), set(json.loads(path.read_text())))
        except HyperProveError as error:  # a run of a retired option: the line names the commit that reruns it
            assert f"{path}: program." in str(error) and "retired" in str(error) and any(at in str(error) for at in ProgramConfig.RETIRED_AT.values())
            retired.append(path.stem)
    assert sorted(retired) == sorted([f"{data}-train-{option}" for data in ("2wiki", "hotpotqa", "musique") for option in ("chains", "fold", "last-hop", "subject")]
                                     + ["hotpotqa-train-option-hops", "hotpotqa-more-train-comparison-option-hops"])
    compiled = {config.compile.out for config, sections in configs.values() if "compile" in sections}
    kinds = []
    for stem, (config, sections) in configs.items():
        if "compile" in sections:  # a compile writes a program, which evaluate configs then name
            assert config.compile.out == f"experiments/programs/{stem}.json"
            kinds.append("compile")
            continue
        assert config.evaluation.name == stem and config.evaluation.out == f"experiments/results/{stem}"
        if "sweep" in sections:
            assert config.evaluation.decomposition == "gold" and config.sweep.validate and config.sweep.trials >= 30
            kinds.append("sweep")
            continue
        assert parse_systems(config.evaluation.retrievers) == config.evaluation.retrievers
        lm_run = bool(re.search(r"-lm\d+|-train-", stem)) and "-gold" not in stem  # 2wiki-train-gold: the train gold steps
        assert config.evaluation.decomposition == ("lm" if lm_run else "gold")
        assert config.program.compiled is None or config.program.compiled in compiled
        kinds.append("evaluate")
    assert sorted(kinds) == ["compile"] * 17 + ["evaluate"] * 126 + ["sweep"] * 4


def test_each_config_with_a_committed_run_reruns_the_settings_that_run_recorded():
    # REPORT gives `hyperprove evaluate --config experiments/configs/NAME.json` as each run's
    # command: a default changed since must not change what that command runs, so a config pins
    # every setting where the run's record (fields it predates read as `from_record` reads them)
    # and today's defaults part
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "experiments"
    runtime = {"local_model_dir", "replay", "live", "api_base", "name", "description", "out"}
    compared = 0
    for results in sorted((root / "results").glob("*/results.json")):
        path = root / "configs" / f"{results.parent.name}.json"
        if not path.is_file():
            continue
        recorded = json.loads(results.read_text())["config"]
        on = [option for option, off in ProgramConfig.RETIRED.items() if recorded["program"].get(option, off) != off]
        if on:
            with pytest.raises(HyperProveError, match=f"retired .* {ProgramConfig.RETIRED_AT[on[0]]}, reruns this config"):
                HyperProveConfig.from_file(path)
            continue
        ran, now = HyperProveConfig.from_record(recorded).to_dict(), HyperProveConfig.from_file(path).to_dict()
        for section in ("evaluation", "retriever", "index", "lm", "program"):
            differ = {key: (now[section].get(key), value) for key, value in ran[section].items()
                      if key not in runtime and now[section].get(key) != value}
            assert not differ, f"{path.name}: {section} (config, recorded run) {differ}"
        compared += 1
    assert compared >= 60


def test_a_comma_list_of_retrievers_from_the_command_line():
    config = HyperProveConfig().with_overrides(evaluation={"retrievers": "dense, ppr", "read": None})
    assert config.evaluation.retrievers == ["dense", "ppr"] and config.evaluation.read is True


def test_a_record_without_the_program_options_reruns_the_program_it_ran():
    # a run recorded before the answer-path options existed ran with none of them
    old = {"program": {"max_hops": 4, "carry": "supporting", "compiled": None}}
    program = HyperProveConfig.from_record(old).program
    assert (program.entity_retries, program.grounded_hops, program.question_channel, program.reader_evidence) == (0, False, False, "facts")
    assert program.choose_options is False
    # what a record holds wins, and a plain config file still takes today's defaults
    newer = {"program": {"reader_evidence": "passages", "question_channel": True}}
    program = HyperProveConfig.from_record(newer).program
    assert (program.reader_evidence, program.question_channel, program.grounded_hops) == ("passages", True, False)
    assert HyperProveConfig.from_dict({}).program == ProgramConfig()


def test_a_record_without_the_entity_weight_reruns_the_retriever_without_it():
    old = {"retriever": {"alpha": 0.9, "theta": 0.05, "depth": 2, "top_k": 3}}
    assert HyperProveConfig.from_record(old).retriever.entity_weight == 0.0
    assert HyperProveConfig.from_record({"retriever": {"entity_weight": 0.3}}).retriever.entity_weight == 0.3
    assert HyperProveConfig.from_dict(old).retriever.entity_weight == 0.1  # a config file: today's default


def test_skip_and_limit_select_a_later_block_of_questions():
    from pipeline.config import EvaluationConfig

    assert EvaluationConfig(skip=60, limit=300).selected(list(range(400))) == list(range(60, 360))
    assert EvaluationConfig(skip=390).selected(list(range(400))) == list(range(390, 400))
    assert EvaluationConfig().selected([1, 2]) == [1, 2]
    typed = [Question(id=str(k), question="q", answer="a", type=kind) for k, kind in enumerate(["bridge", "comparison", "comparison", "2hop", "comparison"])]
    # after the first question, the comparisons and 2-hop ones, at most two: questions 2 and 3
    assert [q.id for q in EvaluationConfig(skip=1, limit=2, types="comparison, 2hop").selected(typed)] == ["1", "2"]
    assert [q.id for q in EvaluationConfig(types=["2hop"]).selected(typed)] == ["3"]


def test_a_retired_option_named_off_is_dropped_and_named_on_is_refused_with_the_commit_that_reruns_it():
    assert "chain_checks" not in HyperProveConfig.from_dict({"program": {"chain_checks": False, "max_hops": 3}}).to_dict()["program"]
    with pytest.raises(HyperProveError) as refused:
        HyperProveConfig.from_dict({"program": {"last_hop_answers": True}}, source="old.json")
    assert str(refused.value) == ("old.json: program.last_hop_answers=True: this option was retired (train runs showed no gain: "
                                  "experiments/FINDINGS.md); the last commit with it, 10ca878, reruns this config "
                                  "(git worktree add ../hyperprove-10ca878 10ca878)")
    with pytest.raises(HyperProveError, match=r"program.option_hops=True: .* the last commit with it, 57b67b4, reruns this config"):
        HyperProveConfig.from_dict({"program": {"option_hops": True}}, source="old.json")


def test_a_record_without_the_sentence_rules_reruns_the_first_ones_and_an_index_built_before_them_says_so(tmp_path):
    from pipeline.config import IndexConfig
    from pipeline.index.store import check_built_with

    assert HyperProveConfig.from_record({"index": {"eta": 0.8}}).index.sentence_rules == 1
    assert HyperProveConfig.from_dict({}).index.sentence_rules == 2  # a config file: today's rules
    assert "sentence_rules" in IndexConfig().shaping()  # an index cache of the other rules is never reused
    manifest = {"config": {"extractor": "sentences", "embedder": "e", "eta": 0.8, "synonym_neighbors": 10, "exact_search_max": 50000}}
    check_built_with(manifest, tmp_path, IndexConfig(embedder="e", sentence_rules=1))  # built before the rules existed: rules 1
    with pytest.raises(HyperProveError, match="built with sentence_rules 1, but sentence_rules 2 was asked for; ask for 1 "
                                              r"\(--sentence-rules or index.sentence_rules in the config\) or rebuild the index"):
        check_built_with(manifest, tmp_path, IndexConfig(embedder="e"))


def test_a_folder_under_home_in_an_experiment_file(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = HyperProveConfig.from_dict({"evaluation": {"corpus": "~/docs/cargo", "questions": "q.json"}})
    assert config.evaluation.corpus == f"{tmp_path}/docs/cargo" and config.evaluation.questions == "q.json"


def test_a_record_without_the_hop_reader_option_showed_the_hop_reader_the_documentation_demos():
    # documentation_demos once meant the decomposer and the hop reader both
    assert HyperProveConfig.from_record({"program": {"documentation_demos": True}}).program.documentation_hop_demos is True
    assert HyperProveConfig.from_dict({"program": {"documentation_hop_demos": False}}).program.documentation_hop_demos is False
