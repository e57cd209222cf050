"""What the jobs and the API report of themselves: the jobs' Prometheus metrics (``jobs``), the API's
(``api``), and the scores per minute and model version behind the live page's charts (``score_stats``)."""
