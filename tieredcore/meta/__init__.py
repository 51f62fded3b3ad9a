"""The metadata store: the versioned key/value seam (:mod:`tieredcore.meta.store`) with its SQLite and
ZooKeeper implementations, and what lives in it: topic records and namespace policies in Pulsar's layout
(:mod:`tieredcore.meta.managed_ledgers`), the deletion log of two-phase deletion, per-topic leases.
Knows nothing of object stores or the hot tier."""
