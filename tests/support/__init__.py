"""The helpers and programs the tests share: sample events and records, record factories, the feature
reference implementation, the feature job helpers, the chaos harness and the jobs the chaos tests run as
subprocesses (``python -m tests.support.<module>`` from the project root). No tests here.
"""
