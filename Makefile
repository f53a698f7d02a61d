# Each target creates .venv if it is missing. torch is pinned and installed first, so that
# pip takes the local CPU build here and the CUDA build on a GPU machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: demo test bench lint clean

$(BIN)/vaecf: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(BIN)/vaecf

demo: $(BIN)/vaecf
	$(BIN)/vaecf demo

# The suite starts a few hundred Python processes: the package's bytecode is compiled once up
# front, since an environment with PYTHONDONTWRITEBYTECODE set would recompile it in each.
# Mostly it waits on those processes' start-ups, one core at a time: TEST_WORKERS workers
# (pytest-xdist; each test file on one worker, so its module fixtures are built once) overlap
# them, each process on one thread so that they do not oversubscribe the cores (2 cores, Zen 3:
# 654-710 s in one process, 372 s in two).
TEST_WORKERS ?= 2
test: $(BIN)/vaecf
	$(BIN)/python -m compileall -q src/vaecf
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) \
		--dist loadfile --durations=15

bench: $(BIN)/vaecf
	$(BIN)/python benchmarks/accuracy.py

lint: $(BIN)/vaecf
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
