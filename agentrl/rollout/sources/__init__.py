"""Where each iteration's groups come from: one rollout source per training mode, one module each.

* :mod:`~agentrl.rollout.sources.sync` (``trainer.mode=sync``): iteration k rolls out its own tasks
  now; then the engine may sleep through the learner's passes.
* :mod:`~agentrl.rollout.sources.call_ahead` (``one_step_off``): rollout call k+1 runs while the
  learner updates on call k; weights change only between calls.
* :mod:`~agentrl.rollout.sources.streaming` (``async``): every worker plays groups continuously and
  hands each back when its last episode is done; new weights reach the workers between env steps;
  groups older than ``trainer.max_staleness`` are dropped, groups without signal filtered
  (``trainer.filter_groups``), and the stream refills both.

:mod:`~agentrl.rollout.sources.base` holds the interface (:class:`RolloutSource`), and
:mod:`~agentrl.rollout.sources.buffer` the buffer of whole groups that the overlapped sources share.
The training mode (:class:`agentrl.config.modes.TrainingMode`) names its source by import path;
:func:`rollout_source` builds it.
"""

from __future__ import annotations

from agentrl.config.modes import training_mode
from agentrl.plugins import PluginError, import_object
from agentrl.rollout.sources.base import RolloutSource, Taken, rollout_seed


def rollout_source(cfg, workers, tasks_of) -> RolloutSource:
    """The source of ``trainer.mode`` over ``workers`` (:class:`~agentrl.rollout.workers.RolloutWorkerGroup`);
    ``tasks_of(i)``: iteration i's tasks (:class:`~agentrl.runs.task_schedule.TaskSchedule`)."""
    mode = training_mode(cfg.trainer.mode)
    source = import_object(mode.source, f"trainer.mode={mode.name}: TrainingMode.source")
    if not (isinstance(source, type) and issubclass(source, RolloutSource)):
        raise PluginError(f"trainer.mode={mode.name}: TrainingMode.source={mode.source!r} is not a RolloutSource "
                          "subclass (agentrl.rollout.sources.RolloutSource)")
    return source.from_config(cfg, workers, tasks_of)


__all__ = ["RolloutSource", "Taken", "rollout_seed", "rollout_source"]
