"""The embedded engine: one node's store in its data directory, no other service. The commit log (segments,
their queue indexes and recovery), its readers and tail, and the records in RocksDB (`meta/`)."""
