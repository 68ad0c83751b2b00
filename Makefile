# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each sets up its own virtual environment first. TORCH picks the torch build: the default is the CPU
# build this project's machines carry on disk; elsewhere e.g. `make test TORCH=torch`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
OLDEST := .venv-oldest
OLDEST_TRANSFORMERS := transformers==5.23.0

JS_CLIENT := scripts/transformers_js
UPSTREAM_TESTS := tests/upstream/transformers_tests

.PHONY: test test-newest test-oldest js-client demo bench clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH)"
	$(VENV)/bin/pip install -q -e ".[dev]"
	touch $@

# The oldest transformers we declare, for the model's numerical tests (5.24 changed how the cache reaches forward).
$(OLDEST)/.installed: setup.py
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install -q --upgrade pip
	$(OLDEST)/bin/pip install -q "$(TORCH)"
	$(OLDEST)/bin/pip install -q -e ".[dev]" "$(OLDEST_TRANSFORMERS)"
	touch $@

test: test-newest test-oldest

# transformers' own common model tests, from the source distribution of the transformers the environment holds.
$(UPSTREAM_TESTS)/VERSION: $(VENV)/.installed tests/upstream/fetch.py
	$(VENV)/bin/python tests/upstream/fetch.py

# transformers.js, pinned by its lock file, for the tests that load our ONNX export in Node and Chromium. Its
# install scripts only fetch GPU libraries; the CPU runtime ships in the package. Without npm those tests skip, saying so.
js-client:
	@if command -v npm >/dev/null 2>&1; then \
	  if [ ! $(JS_CLIENT)/node_modules/.installed -nt $(JS_CLIENT)/package-lock.json ]; then \
	    (cd $(JS_CLIENT) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) && \
	    touch $(JS_CLIENT)/node_modules/.installed; fi; \
	else echo "npm not found: the transformers.js tests will be skipped"; fi

test-newest: $(VENV)/.installed $(UPSTREAM_TESTS)/VERSION js-client
	$(VENV)/bin/python -m pytest tests -q

test-oldest: $(OLDEST)/.installed
	$(OLDEST)/bin/python -m pytest tests/test_modeling.py tests/test_configuration.py -q

demo: $(VENV)/.installed
	$(VENV)/bin/python scripts/demo.py --output_dir demo_output

bench: $(VENV)/.installed
	$(VENV)/bin/python -m scripts.benchmarks.benchmark

clean:
	rm -rf $(VENV) $(OLDEST) demo_output $(JS_CLIENT)/node_modules $(UPSTREAM_TESTS)
