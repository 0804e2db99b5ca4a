"""Pooled environment servers: many env instances per process, served over Ray or HTTP.

* :class:`~agentrl.envs.server.pool.EnvPool`: the instances and the JSON request API;
* :mod:`~agentrl.envs.server.ray_pool`: the pool as Ray actors, one per shard;
* :mod:`~agentrl.envs.server.http_server`: the pool over HTTP (``agentrl envs serve``; Starlette on uvicorn);
* :mod:`~agentrl.envs.server.api`: the HTTP API's schemas and OpenAPI document (``GET /openapi.json``);
* :class:`~agentrl.envs.server.client.EnvClient`: one client for all of them.
"""

from agentrl.envs.server.client import (EnvClient, EnvRequestError, EnvServerError, EnvTimeoutError,
                                        ResetResult, StepResult)
from agentrl.envs.server.pool import BadRequest, EnvPool

__all__ = ["BadRequest", "EnvClient", "EnvPool", "EnvRequestError", "EnvServerError", "EnvTimeoutError",
           "ResetResult", "StepResult"]
