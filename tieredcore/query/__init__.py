"""The archive as data: topics read as Arrow record batches of messages (or raw entries), planned from
metadata alone and pruned by publish-time statistics (docs/query.md). Spark's data source
(spark_jobs/datasource.py) and the table export are thin layers over this package."""
