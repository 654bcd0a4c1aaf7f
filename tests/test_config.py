"""The one configuration object: sections, validation, overrides, round trip."""

import json

import pytest

from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig


def test_round_trip_and_overrides(tmp_path):
    config = HyperProveConfig().with_overrides(retriever={"alpha": 0.5, "theta": None}, lm={"model": "openai/gpt-4o-mini"},
                                               program={"max_hops": 3}, cache_dir="/tmp/c")
    assert (config.retriever.alpha, config.retriever.theta) == (0.5, 0.05)  # None leaves the default
    assert config.lm.id == "openai/gpt-4o-mini" and config.program.max_hops == 3 and config.cache_dir == "/tmp/c"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    assert HyperProveConfig.from_file(path) == config


@pytest.mark.parametrize("values, message", [
    ({"lm": {"modle": "x"}}, "config: unknown field lm.modle"),
    ({"program": {"carry": "all"}}, "carry='all' must be 'supporting' or 'top_k'"),
    ({"index": {"extractor": "magic"}}, "extractor='magic' must be 'sentences' or 'lm'"),
    ({"lm": "openai/gpt-4o-mini"}, "config: lm must be a JSON object"),
    ({"retrievr": {}}, "unknown field 'retrievr'"),
    ({"evaluation": {"decomposition": "oracle"}}, "decomposition='oracle' must be 'gold' or 'lm'"),
    ({"evaluation": {"limit": 0}}, "limit=0 must be >= 1"),
])
def test_bad_fields_are_named(values, message):
    with pytest.raises(HyperProveError, match=message):
        HyperProveConfig.from_dict(values)


def test_every_shipped_experiment_config_loads_and_names_its_own_results_folder():
    from pathlib import Path

    from experiments.harness import parse_systems

    configs = sorted((Path(__file__).resolve().parents[1] / "experiments" / "configs").glob("*.json"))
    assert len(configs) == 6
    for path in configs:
        config = HyperProveConfig.from_file(path)
        assert config.evaluation.name == path.stem and config.evaluation.out == f"experiments/results/{path.stem}"
        assert parse_systems(config.evaluation.retrievers) == config.evaluation.retrievers
        assert config.evaluation.decomposition == ("lm" if path.stem.endswith("lm60") else "gold")


def test_a_comma_list_of_retrievers_from_the_command_line():
    config = HyperProveConfig().with_overrides(evaluation={"retrievers": "dense, ppr", "read": None})
    assert config.evaluation.retrievers == ["dense", "ppr"] and config.evaluation.read is False
