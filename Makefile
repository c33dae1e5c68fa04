# normbridge: `make demo` runs the quickstart, `make test` the test suite (`make test-fast` without the slow tests), `make docs` builds the site; each sets up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# Test workers: the suite is sized for 2 cores.
WORKERS ?= 2

.PHONY: setup demo test test-fast bench schemas docs docs-cli format clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# torch first, pinned to the CPU build (constraints.txt); everything else may not pull another torch.
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[all,mlflow,test,bench,docs,keras_hub_deps]"
	# keras_hub without its dependencies: they would pull tensorflow (not -cpu) through tensorflow-text.
	$(PIP) install -q -c constraints.txt --no-deps "keras-hub==0.32.0"
	touch $@

demo: setup
	$(PY) examples/quickstart.py
	$(PY) examples/registry_demo.py

# A crashed worker (killed for its memory, a segfault) fails the run instead of being replaced: with --dist loadfile a
# replaced worker could leave the run waiting forever.
XDIST := -n $(WORKERS) --dist loadfile --max-worker-restart=0

# --durations: the slowest tests end every run's output, where the suite's time goes (docs/testing.md).
test: setup
	$(PY) -m pytest -q $(XDIST) --durations=40

# Everything but the tests marked slow (those that start servers or subprocesses: the CLI, Python, a browser).
test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow"

bench: setup
	$(PY) bench/convert.py
	$(PY) bench/models.py
	$(PY) bench/registry.py
	$(PY) bench/service.py
	$(PY) bench/pull.py
	$(PY) bench/checkpoints.py

schemas: setup
	$(PY) -m schemas.json_schema

# The documentation site (MkDocs, offline) into site/; --strict: any warning, such as a broken link, fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# Rewrite docs/cli.md from every command's --help (tests/test_docs.py fails while it is stale).
docs-cli: setup
	$(PY) -m cli.docs_reference docs/cli.md

# Format the code (ruff, line length 120: pyproject.toml); tests/test_format.py checks it.
format: setup
	$(PY) -m ruff format .

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .hypothesis
