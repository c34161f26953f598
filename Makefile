# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv when it is missing and install what they need; a stamp file keyed on
# pyproject.toml keeps them quick when everything is already there.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tabloop-installed
PACKAGES := tabloop evaluation lsp_server completion indexer telemetry backend training common
PIP_LOG := $(VENV)/pip.log
# pip's output goes to a log, shown only when it fails.
PIP := $(PY) -m pip install --quiet
PIP_QUIET := >$(PIP_LOG) 2>&1 || (cat $(PIP_LOG); exit 1)
VSCODE := editors/vscode
# The backend's dashboard: web sources and the charting library from npm, built into the
# package (backend/dashboard/static, not committed; wheels include it).
DASHBOARD_WEB := backend/dashboard/web
DASHBOARD_INDEX := backend/dashboard/static/index.html
DASHBOARD_SOURCES := $(DASHBOARD_WEB)/package.json $(DASHBOARD_WEB)/package-lock.json \
	$(DASHBOARD_WEB)/build.mjs $(wildcard $(DASHBOARD_WEB)/src/*)

.PHONY: demo test lint typecheck pytest test-vscode bench venv dist clean dashboard

venv: $(STAMP)

# torch==2.13.0 first: a CPU build of it lies on this kind of machine, and installing it before
# the project keeps pip from resolving `torch>=2.4` to a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0 $(PIP_QUIET)
	$(PIP) -e '.[dev,models,train]' $(PIP_QUIET)
# The `stream` extra without torchvision (pyproject.toml says why).
	$(PIP) --no-deps 'litdata>=0.2.76,<0.3' $(PIP_QUIET)
	$(PY) -c "import torch, transformers, ctranslate2, onnxruntime_genai, pygls, faiss, sentence_transformers, peft, litdata"
	touch $(STAMP)

# Rebuilt when a source changes; needs npm (and the registry, once, for `npm ci`).
$(DASHBOARD_INDEX): $(DASHBOARD_SOURCES)
	@command -v npm >/dev/null 2>&1 || { echo "npm is needed to build the dashboard"; exit 1; }
	cd $(DASHBOARD_WEB) && npm ci --no-audit --no-fund && npm run build

dashboard: $(DASHBOARD_INDEX)

demo: $(STAMP) $(DASHBOARD_INDEX)
	$(VENV)/bin/tabloop demo

# Style, then the layers and import cycles (the import-linter contracts in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check $(PACKAGES) tests
	$(VENV)/bin/ruff format --check $(PACKAGES) tests
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP) $(DASHBOARD_INDEX)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-vscode:
	@if command -v npm >/dev/null 2>&1 && [ -f $(VSCODE)/package.json ]; then \
		cd $(VSCODE) && npm ci --no-audit --no-fund && npm run build && npm test; \
	else echo "npm or $(VSCODE) missing: VS Code extension tests not run"; fi

test: lint typecheck pytest test-vscode

# The benchmarks marked for it in tabloop/cli.py's one list, with their defaults (minutes on a
# CPU; `complete`, `engines` and `dtype` run the bundled model); each prints JSON, kept under
# bench/results/.
BENCHES = $(shell $(VENV)/bin/tabloop bench --list make)

bench: $(STAMP)
	mkdir -p bench/results
	for name in $(BENCHES); do \
		echo "== tabloop bench $$name"; \
		$(VENV)/bin/tabloop bench $$name --json | tee bench/results/$$name.json || exit 1; \
	done

# A wheel and an sdist in dist/ (tabloop is not on PyPI yet: install from these or the checkout).
dist: $(STAMP) $(DASHBOARD_INDEX)
	$(PY) -m build --no-isolation --outdir dist .

clean:
	rm -rf $(VENV) dist .pytest_cache .mypy_cache .ruff_cache backend/dashboard/static
