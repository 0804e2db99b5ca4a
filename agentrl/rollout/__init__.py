"""Multi-turn rollout: prompts, response parsing and the rollout engine over a generation back end
(:mod:`agentrl.generation`)."""
