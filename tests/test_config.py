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
])
def test_bad_fields_are_named(values, message):
    with pytest.raises(HyperProveError, match=message):
        HyperProveConfig.from_dict(values)
