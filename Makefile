# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv (Python 3.11, PySpark 4.3, pyarrow, pandas<3) on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# PySpark's Python workers must run this interpreter, or they cannot import pyarrow.
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1

# Test files run on this many processes at once (pytest-xdist, each its own Spark; a file
# stays on one process): 2 on CI's two cores, where a test's Spark jobs leave a core idle
# most of the time (PYTEST_WORKERS=0 runs them in this process, one after another).
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
# The suites held in one file deal out their tests one by one (Nexmark's) or by test class
# (PySpark's own, a session each): by file, one process would run them all while the other
# waits.
PYTEST_BY_TEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist load
PYTEST_BY_CLASS := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope

.PHONY: setup test-setup older-venvs demo test test-connect test-nexmark test-pyspark test-pyspark-extended test-pyspark-connect test-porting test-faults test-versions test-upgrade test-extended test-install-keeps-pyspark chaos fuzz

# uv installs (downloads in parallel, no byte-compiling): about a quarter of pip's time
# for PySpark and the test extras from a cold cache, which CI pays six times (issue 58).
# The venv keeps pip for what users add by hand (pip install -e '.[bench]').
UV := $(VENV)/bin/uv

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv
	$(UV) pip install --quiet --python $(PY) -e '.[test]'
	touch $@

# (a venv made before uv was used here gets it on first need)
$(UV): $(VENV)/.installed
	test -x $@ || $(PY) -m pip install --quiet uv

setup: $(VENV)/.installed $(UV)

# The test runs' Spark drivers map the classes a test loads from a class-data-sharing
# archive made once per venv (tests/spark_class_archive.py): a session and its first job
# start in about half the time, and the suites start hundreds (issue 58). It is named in
# spark.driver.defaultJavaOptions (so a test's own extraJavaOptions add to it) through
# PYSPARK_SUBMIT_ARGS, which every PySpark driver a test starts inherits; not through a
# Spark conf directory, which would be on the class path, and the JVM maps no archive with
# a non-empty directory on its class path.
CLASSES := $(VENV)/spark-classes.jsa
$(CLASSES): $(VENV)/.installed tests/spark_class_archive.py
	rm -f $@; $(PY) tests/spark_class_archive.py $(abspath $@) > $(VENV)/spark-classes.log 2>&1 \
	  || { tail -20 $(VENV)/spark-classes.log; exit 1; }
	test -s $@ || { grep -m5 'cds' $(VENV)/spark-classes.log; exit 1; }
# Azurite, Microsoft's Azure Blob Storage emulator, for tests/test_azure.py (the npm
# registry, the machine's Node.js): installed into the venv, as the Python test tools are.
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob
$(AZURITE): $(VENV)/.installed
	mkdir -p $(VENV)/azurite
	test -f $(VENV)/azurite/package.json || echo '{"private": true}' > $(VENV)/azurite/package.json
	cd $(VENV)/azurite && npm install --silent --no-audit --no-fund azurite@3.37.0
	test -x $@
test-setup: setup $(CLASSES) $(AZURITE)
# The same drivers compile with the JIT's first tier only (-XX:TieredStopAtLevel=1): a test
# JVM runs thousands of short queries on two cores, where the optimising compiler's threads
# took CPU the tests needed; 67 differential tests ran in 390 s against 436 s with both
# tiers (2026-12-03, the machine otherwise idle). Test runs only: users' JVMs are Spark's.
# They collect with the serial collector: a test's heap is small, and G1's threads took
# CPU as the compiler's did. The suite is CPU-bound on two cores (idle 3% of the time with
# two test processes; a third gained nothing, 2026-12-03), so the JVMs' CPU is its time.
JAVA_OPTS := -XX:SharedArchiveFile=$(abspath $(CLASSES)) -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
# (the drivers' PYSPARK_SUBMIT_ARGS: these options, and the confs given as $(1))
spark_submit = PYSPARK_SUBMIT_ARGS="--conf 'spark.driver.defaultJavaOptions=$(JAVA_OPTS)' $(1)pyspark-shell"
WITH_CLASSES := $(call spark_submit,)
# make test and make test-faults run Spark's batch jobs without whole-stage code generation:
# each query compiles a class per stage with Janino, and the suites run thousands of small
# queries, each over a few rows, where compiling cost more than it saved (two differential
# files: the JVM's CPU 104 s against 123 s, 2026-12-03). Both engines of a comparison run
# alike, and microbatch has nothing of its own that depends on it (it reads plans' metrics
# the same either way). The other suites (porting, PySpark's own tests, Connect, the
# upgrade, the older lines) and the benchmarks keep Spark's default, code generation on.
WITHOUT_STAGE_CODEGEN := $(call spark_submit,--conf spark.sql.codegen.wholeStage=false )

demo: setup
	$(VENV)/bin/microbatch demo

# CI's suites leave out the tests marked `extended` (the rest of a sweep CI runs a share of,
# a second form of a fault CI already runs: tests/helpers.ci_share), which make test-extended
# runs with Nexmark's suite and the older PySpark lines (README, "What runs where")
test: test-setup
	$(WITHOUT_STAGE_CODEGEN) $(PYTEST) -m "not porting and not faults and not upgrade and not connect and not nexmark and not extended"

# Nexmark's queries on microbatch and on Spark's engine over the same events, batch by batch
test-nexmark: test-setup
	$(WITH_CLASSES) $(PYTEST_BY_TEST) -m nexmark

# A Spark Connect client (no JVM in the test process) against a Connect server started in
# its own process: what runs over Connect, compared with Spark's engine on the same server
test-connect: test-setup
	$(WITH_CLASSES) $(PYTEST_BY_TEST) -m "connect and not extended"

# Real processes killed with SIGKILL at every step of the batch protocol, with files and Kafka;
# S3, the broker and the disk failing under queries (docs/faults.md)
test-faults: test-setup
	$(WITHOUT_STAGE_CODEGEN) $(PYTEST_BY_TEST) -m "faults and not extended"

# State moving between Spark's engine and microbatch, both ways, every operator (docs/porting.md)
test-porting: test-setup
	$(WITH_CLASSES) $(PYTEST) -m "porting and not extended"

# PySpark's own streaming tests (from the installed wheel) on microbatch: pyspark_suites/
test-pyspark: test-setup
	$(WITH_CLASSES) $(PYTEST_BY_CLASS) -m "not extended" pyspark_suites

# PySpark's own tests of transformWithState's state variables (about 2 minutes: not in CI)
test-pyspark-extended: test-setup
	$(WITH_CLASSES) $(PYTEST_BY_CLASS) -m extended pyspark_suites

# PySpark 4.3's own Spark Connect streaming tests (from the installed wheel), unmodified, on
# microbatch: clients with no JVM against one Connect server in its own process
# (pyspark_connect_suites/; MICROBATCH_PYSPARK_ENGINE=spark runs them on Spark's engine)
test-pyspark-connect: test-setup
	$(WITH_CLASSES) $(PYTEST_BY_CLASS) -p no:cacheprovider pyspark_connect_suites

# The differential subset on each older PySpark line against that version's own engine,
# each in its own virtual environment (.venvs/pyspark-<version>): make test-versions
# (SPARK_VERSIONS="4.0" for one), in make test-extended. The full suite runs on 4.3 (make test);
# CI runs make test-upgrade on 3.5 (below).
SPARK_VERSIONS ?= 4.2 4.1 4.0 3.5
UPGRADE_FROM ?= 3.5
VERSION_TESTS := tests/test_differential_rate.py tests/test_aggregation_differential.py \
	tests/test_dedup_differential.py tests/test_stream_join_differential.py tests/test_file_differential.py \
	tests/test_file_sink.py tests/test_kafka_source.py tests/test_stream_engine.py tests/test_spark_versions.py \
	tests/test_kept_batch_plan.py tests/test_python_worker.py tests/test_batch_session_confs.py
# 4.2, 4.1 and 4.0 differ from 4.3 only where spark_internals.versions says (confs a
# checkpoint records, the offset log's version, features they lack, how workers start): their
# lines run the tests of those differences; the whole subset runs on 3.5 (the other code
# paths, and the join's rules before 4.2, which 4.1 and 4.0 follow), so each line's run
# stays short (issue 58).
VERSION_TESTS_BETWEEN := tests/test_dedup_differential.py tests/test_stream_engine.py tests/test_spark_versions.py \
	tests/test_kept_batch_plan.py tests/test_python_worker.py tests/test_batch_session_confs.py
# 4.2 and 4.1 keep the deduplication's refusals, its recorded provider and its state
# source, not its batch-by-batch comparisons, which 4.0 and 3.5 run (what
# spark_internals.versions switches for it, a conf only 4.3 records, is the same on 4.0,
# 4.1 and 4.2); the comparisons were half of each line's time
VERSION_DESELECT_4_1 := -k "not test_drop_duplicates_matches_spark_batch_by_batch"
# .venvs/pyspark-<line>, made or brought up to date (pyproject.toml newer) for the line $$v
OLDER_VENV = venv=.venvs/pyspark-$$v; \
	  if [ ! -f $$venv/.installed ] || [ pyproject.toml -nt $$venv/.installed ]; then \
	    $(UV) venv --quiet --clear --python $(PYTHON) $$venv; \
	    $(UV) pip install --quiet --python $$venv/bin/python "pyspark==$$v.*" -e '.[test]'; \
	    touch $$venv/.installed; \
	  fi
# The virtual environments of test-upgrade's older lines alone (.ci/run makes them in the
# background while make test runs: their install waits on downloads and the disk, not the CPU)
older-venvs: setup
	set -e; for v in $(UPGRADE_FROM); do $(OLDER_VENV); done

test-versions: setup
	set -e; for v in $(SPARK_VERSIONS); do \
	  $(OLDER_VENV); \
	  echo "== PySpark $$($$venv/bin/python -c 'import pyspark; print(pyspark.__version__)')"; \
	  PYSPARK_PYTHON=$$(pwd)/$$venv/bin/python PYSPARK_DRIVER_PYTHON=$$(pwd)/$$venv/bin/python \
	    tests="$(VERSION_TESTS)"; case $$v in 4.0|4.1|4.2) tests="$(VERSION_TESTS_BETWEEN)";; esac; \
	    case $$v in 4.1|4.2) set -- $(VERSION_DESELECT_4_1);; *) set --;; esac; \
	    $$venv/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -p no:cacheprovider -m "not porting and not faults and not upgrade and not nexmark" "$$@" $$tests; \
	done

# A stateful checkpoint each line of UPGRADE_FROM wrote (both engines) resumed on 4.3 by both
# engines, and back (CI's run of the older lines; make test-versions runs their differential tests)
test-upgrade: setup
	set -e; for v in $(UPGRADE_FROM); do \
	  $(OLDER_VENV); \
	  echo "== a checkpoint PySpark $$v wrote, resumed on $$($(PY) -c 'import pyspark; print(pyspark.__version__)')"; \
	  MICROBATCH_OLDER_PYSPARK_PYTHON=$$(pwd)/.venvs/pyspark-$$v/bin/python $(PY) -m pytest -q -p no:cacheprovider \
	    -m upgrade tests/test_checkpoint_upgrade.py; \
	done

# What CI leaves out (README, "What runs where"), about 70 minutes here: the tests marked
# `extended` in every suite, Nexmark's queries on both engines, the older PySpark lines'
# differential tests. Before a release, and after a change to what they test.
test-extended: test-setup
	$(WITH_CLASSES) $(PYTEST) -m extended
	$(MAKE) test-nexmark
	$(MAKE) test-pyspark-extended
	$(MAKE) test-pyspark-connect
	$(MAKE) test-versions

# A cluster's own PySpark is kept: pyspark 3.5 installed first, then microbatch; the
# query runs on it (docs/spark-versions.md).
# (uv's pip resolves as pip does, keeping an installed requirement that satisfies the
# range, and shares the cache the 3.5 environment of make test-upgrade filled: pip took
# about 100 s of this step's 128 here)
test-install-keeps-pyspark: setup
	set -e; venv=.venvs/keeps-pyspark-3.5; rm -rf $$venv; $(UV) venv --quiet --python $(PYTHON) $$venv; \
	$(UV) pip install --quiet --python $$venv/bin/python "pyspark==3.5.*"; \
	$(UV) pip install --quiet --python $$venv/bin/python -e .; \
	$$venv/bin/python .ci/keeps_pyspark.py

# Seeded SIGKILL chaos for every pipeline kind: make chaos KILLS=100 SEED=7
# (FAULTS=1: S3 and the broker fail too, docs/faults.md; KINDS=stateless,stateful,kafka)
KILLS ?= 100
SEED ?= $(shell date +%s)
chaos: setup
	$(PY) -m microbatch.testing.chaos --kills $(KILLS) --seed $(SEED)$(if $(KINDS), --kinds $(KINDS))$(if $(FAULTS), --faults)

# The differential query fuzzer: generated queries on Spark's engine and on microbatch,
# batch by batch; what differs is minimised and printed as PySpark code:
# make fuzz SEEDS=50 START=1 (PLANT=join-no-evict: with a planted bug it must find)
SEEDS ?= 20
START ?= 1
fuzz: setup
	$(PY) -m microbatch.testing.fuzz --seeds $(SEEDS) --start $(START)$(if $(PLANT), --plant $(PLANT))
