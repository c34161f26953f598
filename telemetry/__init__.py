"""Decision and outcome events, spooled on disk and sent to the training backend."""
