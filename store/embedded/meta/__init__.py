"""The embedded engine's records off the heap, in RocksDB: sessions, offsets, retained messages, wills, bans and
consumer groups; their key layout, options and maintenance."""
