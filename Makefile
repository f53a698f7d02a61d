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
test: $(BIN)/vaecf
	$(BIN)/python -m compileall -q src/vaecf
	$(BIN)/python -m pytest -q --durations=15

bench: $(BIN)/vaecf
	$(BIN)/python benchmarks/accuracy.py

lint: $(BIN)/vaecf
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
