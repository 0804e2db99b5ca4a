"""agentrl: end-to-end reinforcement learning for multi-turn LLM agents."""

__version__ = "0.1.0"
