# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv (Python 3.11, PySpark 4.3, pyarrow, pandas<3) on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# PySpark's Python workers must run this interpreter, or they cannot import pyarrow.
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: setup demo test test-pyspark test-porting test-faults chaos

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/microbatch demo

test: setup
	$(PY) -m pytest -q -m "not porting and not faults"

# Real processes killed with SIGKILL at every step of the batch protocol, with files and Kafka
test-faults: setup
	$(PY) -m pytest -q -m faults

# State moving between Spark's engine and microbatch, both ways, every operator (docs/porting.md)
test-porting: setup
	$(PY) -m pytest -q -m porting

# PySpark's own streaming tests (from the installed wheel) on microbatch: pyspark_suites/
test-pyspark: setup
	$(PY) -m pytest -q pyspark_suites

# Seeded SIGKILL chaos for every pipeline kind: make chaos KILLS=100 SEED=7
KILLS ?= 100
SEED ?= $(shell date +%s)
chaos: setup
	$(PY) -m microbatch.testing.chaos --kills $(KILLS) --seed $(SEED)
