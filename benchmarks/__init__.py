"""Benchmarks: dpproxy against PostgreSQL (python -m benchmarks.run) and accuracy (accuracy.py)."""
