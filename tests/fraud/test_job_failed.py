"""A streaming query's failure is one line: the Python error's own, and a project error raised in a task
keeps its exit code (Redis refusing the credentials on a worker: 3, as at the start)."""

from __future__ import annotations

from contracts.errors import FraudError
from fraud.progress import JobFailedError

REPORT = """[STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted due to stage failure:
Traceback (most recent call last):
  File "/x/features/job.py", line 327, in write
{error}
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
"""


def test_a_project_error_in_a_task_keeps_its_exit_code() -> None:
    failed = JobFailedError(
        REPORT.format(
            error="infra.redis.connection.RedisAccessError: Redis at redis://h:6379/0 refused the credentials"
        )
    )
    assert failed.exit_code == 3
    assert str(failed) == "the streaming query failed: Redis at redis://h:6379/0 refused the credentials"


def test_another_error_in_a_task_is_a_failure_of_the_job() -> None:
    failed = JobFailedError(REPORT.format(error="ValueError: cannot convert float NaN to integer"))
    assert failed.exit_code == FraudError.exit_code == 1
    assert str(failed) == "the streaming query failed: cannot convert float NaN to integer"
