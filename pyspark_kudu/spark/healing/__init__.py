"""Self-healing from the client: liveness reports for tablet servers, the healer that
executes the master's re-replication plans, and the replication actions it needs."""
