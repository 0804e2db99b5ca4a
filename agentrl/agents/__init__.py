"""Example agents written as an outside author would write them: the ``openai`` client against the
gateway's endpoint, agentrl's environment through ``task.env`` (``rollout.agent=agentrl.agents.<module>:run_episode``,
docs/agents.md)."""
