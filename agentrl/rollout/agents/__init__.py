"""Outside agents (``rollout.agent``): episodes played by an agent written outside agentrl, against the
OpenAI-compatible gateway (:mod:`agentrl.gateway`) that serves the rollout's generation back end.

* :mod:`~agentrl.rollout.agents.task`: what an agent gets and returns (:class:`AgentTask`), its
  environment (:class:`EnvSession`), loading it by ``module:function``;
* :mod:`~agentrl.rollout.agents.processes`: agents in processes of their own
  (``rollout.agent_processes``);
* :mod:`~agentrl.rollout.agents.engine`: :class:`AgentEngine`, the rollout engine that runs them
  (selected by :func:`agentrl.rollout.engines.build_engine` when ``rollout.agent`` is set).
"""

from agentrl.rollout.agents.task import AgentError, AgentTask, EnvSession, load_agent

__all__ = ["AgentError", "AgentTask", "EnvSession", "load_agent"]
