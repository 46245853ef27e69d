"""Security managed at run time: Mosquitto's dynamic-security model (clients, groups, roles, ACLs, default access) kept
as one versioned document in the store (`model`), its JSON commands (`commands`), the ACL evaluation (`grants`) and the
authentication source and per-client authorizer built on them (`source`). The node's side (the control topic, the
store and the cluster) is `gateway.ops.dynsec`."""
