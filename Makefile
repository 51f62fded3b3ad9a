# Entry points used by the README and CI. Everything installs itself into .venv.
VENV := .venv
PY := $(VENV)/bin/python
WORKSPACE ?= workspace

.PHONY: setup setup-demo demo test test-fast lint proto bench clean mutants soak

# Set-up by need (scripts/setup.sh): `setup` is everything the tests need (ZooKeeper, Redis, PostgreSQL,
# Chromium, Azurite besides the venv and a JDK); `setup-demo` only what the demo uses (the venv, a JDK).
setup:
	./scripts/setup.sh test

setup-demo:
	./scripts/setup.sh demo

# The main job on embedded defaults: a workspace, a workload, an offload, a verification.
demo: setup-demo
	./scripts/demo.sh $(WORKSPACE)

# Lint, then every test. Pytest's exit code 5 (no tests collected) is a failure here.
test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=30; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests were collected: failing" >&2; exit 1; fi; exit $$rc

# The edit loop: everything but the slow tests (real spark-submit, Airflow runs, kill tests).
test-fast: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests were collected: failing" >&2; exit 1; fi; exit $$rc

# Planted bugs in the deletion paths, each expected to be caught (scripts/mutants.py prints the score).
mutants: setup
	$(PY) scripts/mutants.py

# The model-based test of the whole system (tests/model/test_system_model.py) on SOAK_EXAMPLES schedules
# with a seed of its own, printed first: rerun a failure with SOAK_SEED=<seed> (the failure also prints
# its shrunk schedule and a @reproduce_failure blob).
SOAK_EXAMPLES ?= 10000
ifndef SOAK_SEED
SOAK_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
soak: setup
	@echo "soak: $(SOAK_EXAMPLES) schedules, seed $(SOAK_SEED)"
	TIERED_MODEL_EXAMPLES=$(SOAK_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider -s --timeout=0 \
	  --hypothesis-seed=$(SOAK_SEED) --hypothesis-show-statistics \
	  tests/model/test_system_model.py::test_system_model

lint: setup
	$(VENV)/bin/ruff check .

# Regenerate the committed protobuf code (a test checks it is up to date).
proto: setup
	cd tieredcore/formats/proto && ../../../$(PY) -m grpc_tools.protoc -I . --python_out=. MLDataFormats.proto DataFormats.proto PulsarApi.proto

bench: setup
	$(PY) bench/offload.py

clean:
	rm -rf $(WORKSPACE) .pytest_cache .ruff_cache

# The --py-files zip (tieredcore + spark_jobs, reproducible) for Spark workers without the package.
PYFILES ?= dist/tiered-pyfiles.zip
.PHONY: pyfiles
pyfiles:
	./scripts/build_pyfiles.sh $(PYFILES)
