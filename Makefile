# m3ctl: two entry points (see README.md).
#   make demo  - venv + m3ctl + CPU vLLM, tiny model, doctor, serve, bench, stop
#   make test  - venv as above, lint (ruff check, ruff format --check, mypy), then the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   ?= .m3ctl-demo
PORT   ?= 8011
export M3CTL_STATE_DIR ?= $(abspath $(DEMO))/state

.PHONY: demo demo-doc test setup lint clean

$(BIN)/m3ctl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,dev]'
	$(BIN)/m3ctl dev fix-vllm
	touch $@

setup: $(BIN)/m3ctl

# bench's exit 1 is its verdict (BENCH-INVALID, the result saved and shown: on a 2-core host the tiny server and the
# client share the cores, and a TTFT the host inflated is said so); any other failure stops the demo's server
demo: setup
	@test -f $(DEMO)/tiny-model/config.json || $(BIN)/m3ctl dev tiny-model $(DEMO)/tiny-model
	$(BIN)/m3ctl doctor --model $(DEMO)/tiny-model --port $(PORT)
	$(BIN)/m3ctl serve --model $(DEMO)/tiny-model --name demo --port $(PORT) --detach
	$(BIN)/m3ctl bench --deployment demo --concurrency 4 --num-prompts 40 --input-len 128 --output-len 64 \
	    --output-json $(DEMO)/bench.json || [ $$? -eq 1 ] || ($(BIN)/m3ctl stop demo; exit 1)
	$(BIN)/m3ctl stop demo
	@echo "bench result JSON: $(DEMO)/bench.json"

# docs/demo-80col.txt regenerated from a real `make demo` at 80 columns (scripts/demo_80col.py; the recorded run
# is kept in tests/fixtures/demo/make-demo.txt, which tests/test_demo_doc.py renders and compares with the doc)
demo-doc: setup
	$(PYTHON) scripts/demo_80col.py record --no-setup --venv $(VENV) --port $(PORT)
	$(PYTHON) scripts/demo_80col.py render

test: setup lint
	$(BIN)/python -m pytest -v tests

# ruff's lint rules and formatter, then mypy over m3ctl/ (config and the reasons for each exception:
# pyproject.toml [tool.ruff], [tool.mypy])
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	-$(BIN)/m3ctl stop --all
	rm -rf $(VENV) $(DEMO)
