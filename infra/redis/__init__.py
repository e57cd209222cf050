"""The lookup store in Redis: connections (``connection``), the key schema (``keys``), idempotent writes
(``store``) and reads (``reads``)."""
