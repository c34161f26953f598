"""Benchmarks run by `tabloop bench NAME`; each prints JSON with its baseline from the same run."""
