"""Benchmarks that print figures (ratios measured within one run), never timed tests."""
