"""The exactly-once Kafka sink for Spark Structured Streaming (a Python data source)."""
