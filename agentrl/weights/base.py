"""What a weight path is: how new weights travel from the learner to the rollout workers.

A path is one module of :mod:`agentrl.weights` holding one :class:`WeightPath` subclass with three
parts, each running in its own process:

* ``Sender(learner)``, built inside every learner rank over its
  :class:`~agentrl.learner.engine.Learner`, which offers ``rollout_weights(every_rank=False)`` (the
  full weights with Hugging Face names, one tensor at a time; collective under ZeRO-3),
  ``device``, ``is_main`` (rank 0) and ``zero_stage``;
* ``Receiver(worker)``, built inside every rollout worker over its
  :class:`~agentrl.rollout.workers.RolloutWorker`, which offers ``backend`` (the generation back
  end), ``device``, ``take_weights(state, version)`` (load now, or at the next step boundary while a
  rollout runs) and ``load_between_rollouts(load, version)`` (a load that cannot wait);
* the path itself, in the trainer's process, over the learner group and the rollout worker group:
  :meth:`WeightPath.connect` once, :meth:`WeightPath.push` after each update. It reaches the other
  two through one generic call on each group, never a method per path::

      learner.weights_call(Sender, "method", *args)            # every rank; results in rank order
      rollout.weights_call(Receiver, "method", *args, **kw)    # every worker; calls to wait for
      rollout.weights_call_each(Receiver, "method", [args_of_worker_0, ...])
      rollout.wait(calls)

The built-in paths (``packed``, ``ipc``, ``broadcast``) register with :data:`WEIGHT_PATHS`;
``rollout.weight_sync=my_pkg.my_module:MyPath`` names one of your own. Each declares where it can
run (:meth:`WeightPath.refusal`, one line with the fix) and whether ``auto`` may choose it
(:meth:`WeightPath.auto_applies`, in :attr:`WeightPath.preference` order).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from agentrl.errors import UsageError
from agentrl.plugins import PluginError, PluginRegistry

BUCKET_BYTES = 512 * 2**20   # one bucket's size; a tensor larger than this gets a bucket of its own
ALIGN = 64                   # each tensor starts at a multiple of this, so any dtype can view its bytes


def aligned(count: int) -> int:
    """``count`` bytes rounded up to :data:`ALIGN`."""
    return -(-count // ALIGN) * ALIGN


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat ``uint8`` tensor (a view; contiguous copy first when needed)."""
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


def device_uuid(index: int | None = None) -> str:
    """The UUID of a CUDA device (the same GPU has the same UUID in every process, whatever its index)."""
    index = torch.cuda.current_device() if index is None else index
    return str(torch.cuda.get_device_properties(index).uuid)


@dataclass(frozen=True)
class SyncLayout:
    """Where the learner and the rollout engines run, as a path needs to know it."""

    device: str                          # the learner's: "cuda" or "cpu"
    learner_gpus: tuple[str, ...] = ()   # one UUID per learner rank (empty on CPU)
    rollout_gpus: tuple[str, ...] = ()   # every GPU of every engine (empty on CPU)
    colocated: bool = False              # the placement plan puts engines on the learner's GPUs
    zero_stage: int = 2
    #: the weight paths the generation back end can receive (None: every path)
    backend_paths: tuple[str, ...] | None = None

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def rank0_shares_a_gpu(self) -> bool:
        """The learner's rank 0 sits on a GPU that an engine uses too."""
        return self.on_gpu and bool(self.learner_gpus) and self.learner_gpus[0] in set(self.rollout_gpus)


class WeightPath:
    """One way of moving the learner's weights into every rollout worker (module docstring)."""

    #: ``rollout.weight_sync`` value
    name: str = ""
    #: ``auto`` tries the paths in this order (lower first) and takes the first that applies
    preference: int = 100
    #: whether :meth:`push` may run while a rollout call runs (the workers load at a step boundary)
    during_rollout: bool = True
    #: the learner's memory stays in use by the workers during a push (its CUDA cache is emptied first)
    shares_learner_memory: bool = False
    #: the classes built in the learner ranks and in the rollout workers
    Sender: type = object
    Receiver: type = object

    @classmethod
    def refusal(cls, layout: SyncLayout) -> str | None:
        """Why this path cannot run on ``layout``, with the fix, or None when it can."""
        return None

    @classmethod
    def auto_applies(cls, layout: SyncLayout) -> bool:
        """Whether ``rollout.weight_sync=auto`` may choose this path for ``layout``."""
        return cls.refusal(layout) is None

    def __init__(self, learner: Any, rollout: Any):
        self.learner, self.rollout = learner, rollout
        #: empty the learner's CUDA cache before each push (the engines on its GPUs wake to load)
        self.free_learner_cache = False

    def connect(self) -> None:
        """Whatever the path sets up once, before the first push."""

    def push(self, version: int) -> None:
        """Every worker gets the learner's weights as policy ``version``."""
        if self.free_learner_cache:
            self.learner.free_cached_memory()
        self.send(version)

    def send(self, version: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not define send(version)")


def check_weight_path(obj: Any, where: str) -> type[WeightPath]:
    if not (inspect.isclass(obj) and issubclass(obj, WeightPath)):
        raise PluginError(f"{where} is not a weight path: subclass agentrl.weights.WeightPath "
                          "(docs/architecture.md, 'Where to add what')")
    if not obj.name or not isinstance(obj.name, str):
        raise PluginError(f"{where} needs a class attribute name = '<path name>'")
    if obj.send is WeightPath.send:
        raise PluginError(f"{where} does not define send(version)")
    for part in ("Sender", "Receiver"):
        if getattr(obj, part) is object:
            raise PluginError(f"{where} needs a nested class {part} (built in every "
                              f"{'learner rank' if part == 'Sender' else 'rollout worker'})")
    return obj


WEIGHT_PATHS: PluginRegistry[type[WeightPath]] = PluginRegistry(
    "weight path", key="rollout.weight_sync", package="agentrl.weights", check=check_weight_path,
    entry_point_group="agentrl.weight_paths")


def choose_path(wanted: str, layout: SyncLayout) -> type[WeightPath]:
    """The path ``rollout.weight_sync`` asks for, refused in one line where it cannot run; for ``auto``
    the first built-in path (by :attr:`~WeightPath.preference`) that applies to ``layout``."""
    if wanted != "auto":
        path = WEIGHT_PATHS.get(wanted)
        reason = path.refusal(layout)
        if reason is not None:
            raise UsageError(f"rollout.weight_sync={wanted} {reason}")
        return path
    for path in sorted(WEIGHT_PATHS.builtin().values(), key=lambda p: p.preference):
        if path.refusal(layout) is None and path.auto_applies(layout):
            return path
    raise UsageError("rollout.weight_sync=auto found no weight path for this layout: name one with "
                     f"rollout.weight_sync ({', '.join(WEIGHT_PATHS.names())})")


def backend_refusal(name: str, layout: SyncLayout) -> str | None:
    """The refusal of a path the generation back end cannot receive."""
    if layout.backend_paths is not None and name not in layout.backend_paths:
        return (f"the generation back end receives only {', '.join(layout.backend_paths) or 'no'} weights; set "
                "rollout.weight_sync=auto")
    return None


def first(results: Sequence[Any]) -> Any:
    """Rank 0's result of a learner call (the other ranks return None or their share of a collective)."""
    return results[0]


__all__ = ["ALIGN", "BUCKET_BYTES", "SyncLayout", "WEIGHT_PATHS", "WeightPath", "aligned", "backend_refusal",
           "byte_view", "check_weight_path", "choose_path", "device_uuid", "first"]
