"""Training the completion model: LoRA adapters from a workspace's code and from what users did
with suggestions, with a budget, checkpoints that survive a kill, and a registry of versions."""
