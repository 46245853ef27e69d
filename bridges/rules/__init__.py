"""Rules: select messages of the log by topic and condition, shape them, and hand them to an action (a sink) that
reads from a stored position."""
