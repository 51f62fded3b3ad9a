"""tieredcore: Pulsar-compatible tiered storage for segmented logs (no Airflow, no Spark here)."""

__version__ = "0.1.0"
