"""The learning loop on the backend: rewards from events, off-policy evaluation, the trainer and
the per-tenant policy registry."""
