"""The data pipeline: the lake bridge (log -> partitioned Parquet) and the PySpark jobs that read the lake."""
