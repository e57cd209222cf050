"""Spark: the session and its processes (``session``, ``config``, ``daemon``, ``logs``, ``pyspark_zip``,
``class_archive``, ``cluster``, ``jvm/``), the timing of its tasks (``timing``) and Spark DDL from Arrow
schemas (``schemas``).

This ``__init__`` imports nothing: several modules here hold no PySpark (the timings, say) and the stages'
pure cores import them without starting PySpark's import."""
