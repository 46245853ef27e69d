"""Running a node: bans, graceful drain, periodic chores, `$SYS` topics and structured logs."""
