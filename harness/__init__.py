"""What the tests and the benchmarks start and read: real `llmserve` processes on loopback
(server.py), a cluster of them behind a real Envoy (envoy_cluster.py), and their Prometheus
samples (metrics.py). A top-level package beside tests/ and bench/, so that neither imports the
other's internals; not part of the wheel (pyproject.toml finds packages under service/ and client/)."""
