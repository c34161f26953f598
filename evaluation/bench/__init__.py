"""Benchmarks run by `tabloop bench NAME`; each prints JSON.

Every one but `telemetry` (held to fixed goals) reports a baseline measured in the same run.
"""
