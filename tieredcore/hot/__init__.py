"""The hot tier (BookKeeper's role): the seam every hot tier implements (:mod:`tieredcore.hot.tier`), the
embedded local ledger store (:mod:`tieredcore.hot.local`, with its writer :mod:`tieredcore.hot.writer`,
its read handle :mod:`tieredcore.hot.handle` and their descriptor chores :mod:`tieredcore.hot.files`)
and its on-disk format and torn-tail recovery (:mod:`tieredcore.hot.format`). Knows nothing of object
stores or metadata."""
