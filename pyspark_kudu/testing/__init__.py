"""Test and benchmark support outside the library's import path: the standalone-cluster
launcher. Nothing in the library imports it; only tests, benchmarks and the fault-injection
tools (``pyspark_kudu.tools.faults``) that run clusters do."""
