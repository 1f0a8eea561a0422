"""capseal.attest — TPM quotes in the hardware-evidence slot."""
