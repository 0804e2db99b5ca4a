"""Multi-turn rollout: prompts, response parsing, generation backends and the rollout engine."""
