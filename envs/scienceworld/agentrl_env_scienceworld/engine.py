"""Starting the ScienceWorld engine (the ``scienceworld`` package's Scala simulator, run in a JVM).

The package is imported here only, when an engine is started: agentrl and the environment's
declaration load without it. A missing package or a missing ``java`` is one clear line.

**Reproducible engines.** Under the JVM's default settings the engine is not deterministic: two
engines given the same task variation and the same actions sometimes build a different world
(``a wood cup (containing red paint)`` in one, ``(containing blue paint)`` in the other) or name
objects differently, and so list other valid actions: the simulator iterates over collections
ordered by the JVM's identity hash codes, which are random per JVM. ``deterministic=True`` (the
default) starts the JVM with ``-XX:hashCode=2`` (every identity hash code the same), which makes
those orders the insertion order: the same variation then gives the same world and the same
replies in every engine, which agentrl needs (the G environments of a group must start from the
same state; GiGPO groups steps by identical observations). The simulator's code is unchanged.
``python -m agentrl_env_scienceworld.check --nondeterministic`` measures the default JVM's behaviour.
"""

from __future__ import annotations

import os
import shutil
import threading

from agentrl.errors import UsageError

ENGINE_VERSION = "1.2.3"
# the engine's own step limit ends an episode with isCompleted; agentrl's TextEnv applies
# max_steps itself (truncated), so the engine is started with a limit no episode reaches
ENGINE_STEP_LIMIT = 1_000_000
DETERMINISTIC_JVM_OPTIONS = "-XX:+UnlockExperimentalVMOptions -XX:hashCode=2"
_LAUNCH_LOCK = threading.Lock()  # JAVA_TOOL_OPTIONS is process-wide while a JVM starts


def start_engine(deterministic: bool = True):
    """A new ``scienceworld.ScienceWorldEnv`` (one JVM) with no task loaded; ``deterministic``: see above."""
    try:
        # heavy optional dependency (a 7.8 MB jar and a JVM per engine): imported only here
        from scienceworld import ScienceWorldEnv
    except ImportError as err:
        raise UsageError(f"the scienceworld environment needs the scienceworld package ({err}): "
                         f"pip install scienceworld=={ENGINE_VERSION} (or pip install -e envs/scienceworld)") from err
    if shutil.which("java") is None:
        raise UsageError("the scienceworld environment needs Java 17 (no java on PATH): "
                         "apt-get install openjdk-17-jre-headless (scripts/setup.sh installs it)")
    if not deterministic:
        return ScienceWorldEnv("", envStepLimit=ENGINE_STEP_LIMIT)
    with _LAUNCH_LOCK:
        before = os.environ.get("JAVA_TOOL_OPTIONS")
        options = f"{before} {DETERMINISTIC_JVM_OPTIONS}" if before else DETERMINISTIC_JVM_OPTIONS
        os.environ["JAVA_TOOL_OPTIONS"] = options
        try:
            return ScienceWorldEnv("", envStepLimit=ENGINE_STEP_LIMIT)
        finally:
            if before is None:
                del os.environ["JAVA_TOOL_OPTIONS"]
            else:
                os.environ["JAVA_TOOL_OPTIONS"] = before
