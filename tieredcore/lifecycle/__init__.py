"""Jobs: what is due (offload thresholds, deletion lag, retention, scrub, compaction planning and cost), the
units of work and their reports, running them, the deletion drain (phase 2 of two-phase deletion), orphan
reconciliation, key rotation and the operator's overview. What writes topic records is in
:mod:`tieredcore.offload` (docs/architecture.md)."""
