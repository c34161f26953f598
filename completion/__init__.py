"""Fill-in-the-middle completion: context, prompts, model runners, caches and the gate policy."""
