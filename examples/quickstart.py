"""The ten-line use of the API shown in the README."""

import tempfile
from pathlib import Path

from capseal import Producer, verify_ledger
from capseal.keys import UnsafeEphemeralSigner

ledger = Path(tempfile.mkdtemp()) / "capsules.db"
with Producer(operator="acme", developer="buyer-agent@1.4", signer=UnsafeEphemeralSigner(), ledger=ledger) as producer:
    planned = producer.planned("po-7", effect_type="write_order", request={"sku": "A-100", "qty": 3})
    record = producer.confirmed(planned, response={"order_id": "O-5531"}, effect_attestation="gate_executed")
print(record.capsule["capsule_id"], record.capsule["assurance"])   # derived, never accepted
print("hardware_evidence:", record.hardware_evidence)              # None until a TPM quote is taken
print("ledger ok:", verify_ledger(ledger).ok)
