"""The device data lake: the log and the gateway's events exported as partitioned Parquet (see `schema`)."""
