"""Benchmarks run by `tabloop bench NAME`; each prints JSON with its baseline measured in the same run."""
