"""The cold tier: the object-store seam (:mod:`tieredcore.cold.blob`), where objects live and how a store
is opened (:mod:`tieredcore.cold.location`), what wraps a store (chunked transforms, the chunk caches, key
rings, request counting, failure budgets) and the backends themselves (:mod:`tieredcore.cold.backends`:
filesystem, S3, Azure Blob, GCS). Knows nothing of ledgers' hot copies or of metadata."""
