# The two entry points of the README. Each makes its own environment first (scripts/bootstrap.sh).
.PHONY: demo unit test test-fast lint chaos crds docs bootstrap

bootstrap:
	@bash scripts/bootstrap.sh

# The whole stack on this machine, no cluster, no GPU: emulated API server, local S3, operator, vLLM on CPU.
demo: bootstrap
	.venv/bin/python -m moelora.local

# Tiers (docs/development.md): unit < test < chaos. Most of a test's time is spent waiting on servers it started,
# so workers share two cores well; `loadscope` keeps a module's tests (and its stack) on one worker. make test has
# two: a third would run three modules' vLLM pods at once, more than 24 GiB.
PYTEST = .venv/bin/python -m pytest tests

# Pure and in-process: no server, no other program, no vLLM or Triton.
unit: bootstrap
	$(PYTEST) -m "not slow and not chaos and not integration" -n 2 --timeout 60

# Every test but the full-size chaos runs.
test: bootstrap
	$(PYTEST) -m "not chaos" -n 2 --dist loadscope --no-loadscope-reorder --timeout 900

# The full-size chaos runs (issue 17's suite): SIGKILLs of the operator, agent and vLLM, S3 faults at 100 adapters.
chaos: bootstrap
	$(PYTEST) -m chaos -n 3 --dist loadscope --no-loadscope-reorder --timeout 1800

# Without the tests that start vLLM.
test-fast: bootstrap
	$(PYTEST) -m "not slow" -n 2 --timeout 300

# Static checks, no tests run: ruff, the import layers (.importlinter) and mypy over the runtime packages.
lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy

crds: bootstrap
	.venv/bin/python -m moelora.api

# The CRD field reference, generated from the same models as the CRDs.
docs: bootstrap
	.venv/bin/python -m moelora.api.docs > docs/crd-reference.md
