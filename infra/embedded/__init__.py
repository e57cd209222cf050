"""The embedded local stack (``stack``): an Apache Kafka broker, a Valkey (Redis-protocol) server and an
MLflow store, started on this machine for ``fraud up``, the demo, the tests and the benchmarks."""
