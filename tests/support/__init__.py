"""What only the tests (and the benchmarks) start: S3Proxy, and an indexer in a child process."""
