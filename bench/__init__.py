"""Benchmarks: each measures side by side in one run and writes bench/results/NAME.json,
its summary, and NAME-samples.json, the whole record (bench/results.py)."""
