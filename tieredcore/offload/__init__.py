"""Offload and read of ledgers in object stores (spec/01) and the crash-safe protocol over the
managed-ledger metadata (spec/02)."""
