"""The environment of a child ``agentrl train`` started by another agentrl process (a sweep cell, a
``bench modes`` run).

The child is a run of its own: it must not join the rendezvous of the process that started it (a
Slurm or torchrun job's ``MASTER_PORT``, or the port an in-process learner of the parent took and
still listens on), else its learner binds that same port and fails with EADDRINUSE.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def child_environment(base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """``base`` (default: this process's environment) less the rendezvous variables, Ray's usage
    statistics off."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in RENDEZVOUS_VARIABLES}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env
