"""Spark entry points (thin): argument parsing, planning on the driver via tieredcore, work distributed
with mapPartitions, a run report, a non-zero exit when any unit failed."""
