# capseal — the two commands a fresh machine needs (see README):
#   make demo   install what is missing, then seal capsules into a ledger (kept in .work/) and verify them
#   make test   install what is missing, then run the whole test suite (SoftHSM2 + swtpm included)
.PHONY: demo test deps bench lint

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# `make test` runs the tests marked direct_path a second time on the plain library paths only
# (CAPSEAL_NO_DIRECT, see keys/direct.py): the Signer contract over every backend (threads
# included), capsules sealed through PKCS#11 keys, a signing process and a TPM, and the token
# reinitialised underneath
NO_DIRECT_TESTS := tests/keys/test_signer_contract.py tests/keys/pkcs11/test_pkcs11_signer.py \
	tests/keys/pkcs11/test_pkcs11_signing_process.py tests/keys/pkcs11/test_pkcs11_recovery.py \
	tests/keys/tpm/test_tpm_signer.py

deps:
	@PYTHON=$(PYTHON) ./hardware/install-deps.sh

demo: deps
	$(PY) examples/demo.py .work/demo-$$(date +%Y%m%dT%H%M%S)

test: deps
	$(PY) -m pytest -n 2 --dist loadfile
	CAPSEAL_NO_DIRECT=1 $(PY) -m pytest -q -n 2 --dist loadfile -m direct_path $(NO_DIRECT_TESTS)
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
