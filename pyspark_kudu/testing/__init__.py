"""Test and benchmark support outside the library's import path: nothing in
``pyspark_kudu`` outside this package imports it."""
