# The two entry points of the README. Each makes its own environment first (scripts/bootstrap.sh).
.PHONY: demo test test-fast lint chaos crds docs bootstrap

bootstrap:
	@bash scripts/bootstrap.sh

# The whole stack on this machine, no cluster, no GPU: emulated API server, local S3, operator, vLLM on CPU.
demo: bootstrap
	.venv/bin/python -m moelora.local

# Every test but the full-size chaos runs.
test: bootstrap
	.venv/bin/python -m pytest tests -m "not chaos"

# The full-size chaos runs (issue 17's suite): SIGKILLs of the operator, agent and vLLM, S3 faults at 100 adapters.
chaos: bootstrap
	.venv/bin/python -m pytest tests -m chaos

# Without the tests that start vLLM.
test-fast: bootstrap
	.venv/bin/python -m pytest tests -m "not slow"

# Static checks, no tests run: ruff, the import layers (.importlinter) and mypy over the runtime packages.
lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/mypy

crds: bootstrap
	.venv/bin/python -m moelora.api

# The CRD field reference, generated from the same models as the CRDs.
docs: bootstrap
	.venv/bin/python -m moelora.api.docs > docs/crd-reference.md
