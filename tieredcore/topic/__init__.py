"""Topics (managed ledgers): the writer that rolls ledgers over, the reader that crosses tiers."""
