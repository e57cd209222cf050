"""Kafka as a replayable Spark source (a Python data source): exact offset ranges, event-time frontiers."""
