"""The hot tier (BookKeeper's role): the seam every hot tier implements (:mod:`tieredcore.hot.tier`), the
embedded local ledger store (:mod:`tieredcore.hot.local`) and its on-disk format and torn-tail recovery
(:mod:`tieredcore.hot.format`). Knows nothing of object stores or metadata."""
