"""Kafka through confluent-kafka, without Spark: connections and their shared timeouts (``connection``),
topic administration (``admin``), logs probed and read (``log``), offsets' names (``offsets``), outages told
apart from mistakes and waited out (``outage``), and a job's watch on its input log (``input_watch``)."""
