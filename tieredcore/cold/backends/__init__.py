"""Object-store backends, each a :class:`~tieredcore.cold.blob.BlobStore`: the local filesystem store
(with its multipart emulation), S3 (boto3), Azure Blob and GCS (with what the two cloud stores share)."""
