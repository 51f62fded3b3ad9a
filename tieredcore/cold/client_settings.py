"""S3 client settings shared by store URLs (tieredcore.cold.location, which validates them) and the S3
store (tieredcore.cold.backends.s3, which applies them); a module of its own so neither imports the other."""

# S3 client defaults for a batch job: fail within seconds and let the job's own retry (the next task
# attempt, the next sweep) take over, instead of botocore's 60 s timeouts and legacy retries.
S3_CONNECT_TIMEOUT = 5.0  # seconds
S3_READ_TIMEOUT = 30.0  # seconds without a byte from the server
S3_MAX_ATTEMPTS = 4  # total attempts per request, the first one included
S3_RETRY_MODE = "adaptive"  # botocore: standard backoff plus client-side rate limiting on throttling
S3_RETRY_MODES = ("standard", "adaptive")
MAX_ATTEMPTS_LIMIT = 20
