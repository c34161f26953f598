"""The training backend: event ingestion, index sync, trainer and policy registry."""
