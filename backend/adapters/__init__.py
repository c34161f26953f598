"""Adapters of the completion model trained for tenants from their text-carrying events."""
