"""Benchmarks: each measures side by side in one run and writes bench/results/NAME.json."""
