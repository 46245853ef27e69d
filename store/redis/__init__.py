"""The Redis engine: the store on one Redis or a Redis Cluster (a cluster's shared store); its connection, Lua
scripts, log, records and consumer groups."""
