"""Local semantic index of the workspace."""
