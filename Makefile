# The two commands of README.md: `make demo` (the main job) and `make test` (the suite).
# Both install the pinned environment into .venv first (once; again when pyproject changes).
PYTHON ?= python3
# The interpreter's minor version (3.11, 3.12, 3.13); empty when PYTHON is not a Python.
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
# The default interpreter installs into .venv; another one, given as PYTHON=, into a venv of its
# own (.venv-3.13), so that `PYTHON=python3.13 make test` tests 3.13 and never the default's venv.
ifeq ($(origin PYTHON),file)
VENV := .venv
else
VENV := .venv-$(PYTHON_VERSION)
endif
ifeq ($(PYTHON_VERSION),)
$(error PYTHON=$(PYTHON) does not run a Python interpreter)
endif
# A venv made by another minor version than PYTHON's (an old .venv, python3 upgraded since) is
# refused in one line, never reused nor deleted.
VENV_VERSION := $(shell [ -x $(VENV)/bin/python ] && $(VENV)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ifneq ($(VENV_VERSION),$(if $(VENV_VERSION),$(PYTHON_VERSION)))
$(error $(VENV) is a Python $(VENV_VERSION) venv but PYTHON=$(PYTHON) is Python $(PYTHON_VERSION): move $(VENV) away, or run with a Python $(VENV_VERSION) as PYTHON)
endif
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
