"""Benchmarks of ipam-bridge (``python -m benchmarks``): figures to read, never pass/fail."""
