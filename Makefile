# Two entry points for a fresh machine: `make demo` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: demo test mutation redis-server test-tools gpu-check-files

$(BIN)/precompute: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# Key lookups need a local redis-server (tests and the demo start their own on a free port).
redis-server:
	@command -v redis-server >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server)

# The tools tests check monitoring and infra with: Prometheus (promtool, a server, the Pushgateway),
# docker-compose (config validation only) and Chromium (the run report's screenshot).
TEST_TOOLS := promtool:prometheus prometheus-pushgateway:prometheus-pushgateway docker-compose:docker-compose chromium:chromium
test-tools:
	@missing="$(foreach t,$(TEST_TOOLS),$$(command -v $(firstword $(subst :, ,$(t))) >/dev/null || echo $(lastword $(subst :, ,$(t)))))"; \
	if [ -n "$$(echo $$missing)" ]; then $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; fi

demo: $(BIN)/precompute redis-server
	$(BIN)/precompute demo

test: $(BIN)/precompute redis-server test-tools
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist loadscope --durations=15

# Mutation testing where a silent bug loses data or lets a request through (tests/mutation/: one
# cosmic-ray config per area, its modules and the fast tests run against each mutant). Prints each
# area's survivors with their diffs, then its score. Takes hours on 2 cores: not part of `test`.
MUTATION_AREAS := rows index_check key_value service
mutation: export PRECOMPUTE_TEST_ENGINE_CACHE := $(CURDIR)/.mutation/engines
mutation: $(BIN)/precompute redis-server
	$(BIN)/pip install --quiet -e '.[test,mutation]'
	@mkdir -p .mutation/engines
	@for area in $(MUTATION_AREAS); do \
	  $(BIN)/cosmic-ray init tests/mutation/$$area.toml .mutation/$$area.sqlite --force && \
	  $(BIN)/cr-filter-operators .mutation/$$area.sqlite tests/mutation/$$area.toml && \
	  $(BIN)/cosmic-ray exec tests/mutation/$$area.toml .mutation/$$area.sqlite && \
	  $(BIN)/cr-report .mutation/$$area.sqlite --surviving-only --show-diff || exit 1; \
	done

# What bench/gpu_check.sh needs on a GPU machine with no network and no pydantic (../shared/GPU.md):
# the wheels of pydantic and pydantic-settings for its Python 3.12, and the bundled model saved in
# FP16 by sentence-transformers (half the size; the check times speed, and gates FP16 against FP32).
GPU_WHEELS := pydantic pydantic-core pydantic-settings annotated-types typing-inspection python-dotenv
gpu-check-files: $(BIN)/precompute
	rm -rf .gpu && mkdir -p .gpu/wheels
	$(BIN)/python -c 'from sentence_transformers import SentenceTransformer; from precompute.models.source import bundled_encoder; SentenceTransformer(str(bundled_encoder().folder), device="cpu").half().save(".gpu/model")'
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels \
	  $(foreach w,$(GPU_WHEELS),$(w)==$$($(BIN)/pip show $(w) | sed -n 's/^Version: //p'))
