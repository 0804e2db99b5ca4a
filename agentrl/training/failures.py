"""How a run stops when its rollout or an actor fails: with a checkpoint of what is finished and one
line that names the cause and the fix (docs/reliability.md).

    stops = FailureStop(run, tracker, checkpoint=trainer.checkpoint)
    with stops.guard(iteration, finished=lambda: trainer.finished):
        ... one iteration ...

* A rollout failure (more env failures than ``rollout.max_env_failures``, a hung rollout worker)
  stops the run after writing a checkpoint of the last iteration whose update the learner holds
  (``finished``): the previous one when the rollout failed before the update, this one when it
  failed after (one_step_off waits for the call in flight after the update), so a resumed run
  never trains an iteration twice. The checkpoint holds the rollout buffer without waiting for
  calls that may never finish; calls and groups in flight run again after the resume.
* A lost actor (a learner rank or a rollout worker whose process or node died) stops the run
  naming the node and the last complete checkpoint: nothing more can be saved.
* A hung learner rank (one that did not return from a collective call within
  ``learner.collective_timeout_s`` of its peers, :mod:`agentrl.learner.rank_calls`) stops the run
  naming the rank and the last complete checkpoint: the other ranks' process group is unusable, so
  nothing more can be saved either.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator, Optional

from agentrl.errors import UsageError
from agentrl.learner.rank_calls import LearnerHangError
from agentrl.rollout.engine import EnvFailureLimitError
from agentrl.rollout.worker_calls import RolloutHangError
from agentrl.runtime.ray_start import lost_node_text


def ray_failures() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call to an actor whose process (or node) is gone, and for a task that failed
    (a surviving learner rank's collective fails when its peer's node is lost)."""
    from ray.exceptions import RayActorError, RayTaskError

    return RayActorError, RayTaskError


class FailureStop:
    """Turns a failed iteration into a clean stop (see the module docstring).

    ``checkpoint(iteration, wait_for_next)`` writes the checkpoint of ``iteration`` (None when it could
    not be written)."""

    def __init__(self, run, tracker, checkpoint: Callable[[int, bool], Optional[Path]]):
        self.run, self.tracker, self.checkpoint = run, tracker, checkpoint

    @contextlib.contextmanager
    def guard(self, iteration: int, finished: Callable[[], int]) -> Iterator[None]:
        try:
            yield
        except (EnvFailureLimitError, RolloutHangError) as err:
            self.rollout_failed(iteration, finished(), err)
        except LearnerHangError as err:
            self.learner_hung(iteration, err)
        except ray_failures() as err:     # an actor's process or its whole Ray node was lost
            self.actor_lost(iteration, err)

    def latest(self) -> str | None:
        latest = self.run.checkpoints / "latest"
        return latest.read_text().strip() if latest.is_file() else None

    def rollout_failed(self, iteration: int, done: int, err: Exception) -> None:
        """Save iteration ``done`` (the learner holds its update) unless it is saved, and stop."""
        if done > 0 and self.latest() == self.run.checkpoint_dir(done).name:
            where = self.run.checkpoint_dir(done)
        elif done > 0:
            where = self.checkpoint(done, False)
        else:
            where = None
        saved = (f"checkpoint {where} holds iteration {done}" if where else
                 "no iteration had finished" if done == 0 else f"iteration {done}'s checkpoint could not be written")
        cause = getattr(err, "cause", None)  # a Ray task error wraps the worker's exception
        failure = cause if isinstance(cause, EnvFailureLimitError) else err
        text = str(failure).strip()
        message = text.splitlines()[-1] if text else type(err).__name__
        self.tracker.status(f"stopped in iteration {iteration}: {message}")
        healthy = ("the rollout workers are healthy" if isinstance(err, RolloutHangError)
                   else getattr(failure, "resume_when", "the env servers are healthy"))
        raise UsageError(f"training stopped in iteration {iteration}: {message}; {saved}; run the same command "
                         f"again to resume once {healthy}") from None

    def last_complete(self) -> str:
        latest = self.latest()
        return (f"checkpoint {self.run.checkpoints / latest} is the last complete one" if latest
                else "no checkpoint had been written")

    def learner_hung(self, iteration: int, err: LearnerHangError) -> None:
        """Stop with one line naming the hung rank(s) and the last complete checkpoint."""
        self.tracker.status(f"stopped in iteration {iteration}: {err}")
        raise UsageError(f"training stopped in iteration {iteration}: {err}; {self.last_complete()}; check that "
                         "node's processes (and GPU), then run the same command again to resume") from None

    def actor_lost(self, iteration: int, err: Exception) -> None:
        """Stop with one line naming the lost node and the last complete checkpoint."""
        from ray.exceptions import RayActorError

        what = lost_node_text(err)
        if not isinstance(err, RayActorError) and not what.startswith("lost "):
            raise err       # a task failed on a healthy cluster: not a lost node
        self.tracker.status(f"stopped in iteration {iteration}: {what}")
        raise UsageError(f"training stopped in iteration {iteration}: {what}; {self.last_complete()}; bring the node back "
                         "(ray start --address ...) or point placement.* at live nodes, then run the same command "
                         "again to resume") from None


__all__ = ["FailureStop", "ray_failures"]
