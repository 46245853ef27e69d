"""Client sessions on a node: delivery state (one cursor over the merge of its queues, the in-flight
window), opening, takeover and closing, shared subscription groups and delayed wills."""
