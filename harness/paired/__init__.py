"""Paired comparison of servers that stay loaded and take turns request by request (issue 47).

``harness.paired.stats``: per-pair ratios, their median, a bootstrap interval and the verdict;
``harness.paired.run``: ``python -m harness paired``, the driver; ``harness.paired.stub_server``: an
OpenAI-shaped server with a chosen speed and injected drift, for the tests of the method.
"""
