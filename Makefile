# capseal — the two commands a fresh machine needs (see README):
#   make demo   install what is missing, then seal capsules into a ledger (kept in .work/) and verify them
#   make test   install what is missing, then run the whole test suite (SoftHSM2 + swtpm included)
.PHONY: demo test deps bench lint

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# `make test` runs every SoftHSM2 and swtpm test (and the Signer contract, marked direct_path) a
# second time on the plain library paths only (CAPSEAL_NO_DIRECT, see keys/direct.py)
NO_DIRECT_MARKS := softhsm or swtpm or direct_path

deps:
	@PYTHON=$(PYTHON) ./hardware/install-deps.sh

demo: deps
	$(PY) examples/demo.py .work/demo-$$(date +%Y%m%dT%H%M%S)

test: deps
	$(PY) -m pytest -n 2 --dist loadfile
	CAPSEAL_NO_DIRECT=1 $(PY) -m pytest -q -n 2 --dist loadfile -m "$(NO_DIRECT_MARKS)"
	./.ci/lower-bounds.sh

bench: deps
	$(PY) bench/seal.py
	$(PY) bench/keys.py
	$(PY) bench/evidence.py
	$(PY) bench/interpret.py
	$(PY) bench/integrations.py

lint: deps
	$(VENV)/bin/ruff check sdk keys attest tests examples bench
	./.ci/mypy.sh
