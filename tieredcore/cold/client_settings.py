"""S3 client settings shared by store URLs (tieredcore.cold.location, which validates them) and the S3
store (tieredcore.cold.backends.s3, which applies them); a module of its own so neither imports the other."""

# Client defaults (S3, and Azure and GCS too) for a batch job: fail within seconds and let the job's own retry
# (the next task attempt, the next sweep) take over, instead of botocore's 60 s timeouts and legacy retries.
# One request to a store that never answers ends within 3 x 10 s + the backoff between attempts (botocore's
# standard mode: at most 1 s, then 2 s) = 33 s; one that refuses connections within ~3 s. With
# store_dead_after (30 s, tieredcore.cold.liveness) that first request declares the store dead and every
# later one fails at once: a dead store ends any command in about 35 s, well within 60 s (README).
S3_CONNECT_TIMEOUT = 5.0  # seconds
S3_READ_TIMEOUT = 10.0  # seconds without a byte from the server
S3_MAX_ATTEMPTS = 3  # total attempts per request, the first one included
S3_RETRY_MODE = "adaptive"  # botocore: standard backoff plus client-side rate limiting on throttling
S3_RETRY_MODES = ("standard", "adaptive")
MAX_ATTEMPTS_LIMIT = 20
