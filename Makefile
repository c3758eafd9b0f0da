# The two commands of README.md: `make demo` (the main job) and `make test` (the suite).
# Both install the pinned environment into .venv first (once; again when pyproject changes).
VENV := .venv
PYTHON ?= python3
export ORCHESTRATE_DATA_DIR ?= $(abspath ../shared/data)
export HF_HUB_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: install demo test test-fast lint docs

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/orchestrate sweep search_spaces/demo.yaml
	$(VENV)/bin/orchestrate report search_spaces/demo.yaml

# --durations: the slowest tests of every run are printed, so that a test that grows shows up in CI
test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q --durations=15

test-fast: $(VENV)/.installed  # the inner loop: no Ray, Tune or end-to-end MLflow
	$(VENV)/bin/python -m pytest -q -m "not slow" --durations=10

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

$(VENV)/.docs-installed: pyproject.toml $(VENV)/.installed
	$(VENV)/bin/pip install --quiet -e '.[docs]'
	touch $@

# The docs site into site/, strict: a warning (a broken link or anchor, a docstring that does not
# render) fails it. NO_MKDOCS_2_WARNING silences mkdocs-material's banner about its own end of life.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
