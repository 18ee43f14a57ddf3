"""Benchmarks: run against a live service, never part of the test suite."""
