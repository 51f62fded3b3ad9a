"""Offload and read of ledgers in object stores (docs/formats.md) and the crash-safe protocol over the
managed-ledger metadata (docs/metadata.md)."""
