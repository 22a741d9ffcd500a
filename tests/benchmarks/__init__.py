"""Benchmarks: run by `python -m tests.benchmarks`, never by the test suite.

Each benchmark starts its own Valkey on a free port without persistence, prints medians
of repeated measurements with ratios against peers measured in the same run, and writes
its figures to `tests/benchmarks/results/<name>.json`.
"""
