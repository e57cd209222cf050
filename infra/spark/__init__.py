"""Spark: the session and its processes (``session``, ``config``, ``daemon``, ``logs``, ``pyspark_zip``,
``class_archive``, ``cluster``, ``jvm/``); Kafka in and out of its queries (Spark's own connector in
``kafka_source``, the event-time ``frontier`` source beside it, the exactly-once ``kafka_sink``); a query's
checkpoint (``checkpoint``, ``offset_log``, ``state_store``); every use of PySpark's private
API (``internals``, the state server's map state among them); the timing of the stages' tasks (``timing``)
and Spark DDL from Arrow schemas (``schemas``).

This ``__init__`` imports nothing: several modules here hold no PySpark (the sink's records, the checkpoint
layouts, the offset log, the timings) and the stages' pure cores import them without starting
PySpark's import."""
