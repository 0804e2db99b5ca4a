"""The warm-start techniques' settings: the one definition of each key, its default, its help text
and what it accepts.

Each technique that one recipe or another adds to plain SFT declares its settings here as a
dataclass whose fields are made with :func:`option` (the field metadata of the configuration and
the estimators' ``Params``: ``help``, ``choices``, ``min``/``max``, ``gt``)::

    @dataclasses.dataclass
    class DaggerOptions:
        name: ClassVar[str] = "dagger"
        tasks: int = option(0, "...", min=0)

The configuration is generated from :data:`TECHNIQUES`: ``trainer.sft`` holds its general settings
(epochs, learning rate, ...) and one section per technique, ``trainer.sft.<name>.<key>``
(:mod:`agentrl.config.schema`); ``agentrl config --keys`` and ``docs/configuration.md`` show their
defaults, bounds and help. A check across one technique's fields runs in its ``__post_init__``,
when the config is built.

The configuration imports this module, so it imports nothing but :mod:`agentrl.errors`: these
declarations sit in layer 2, below the config, while the machinery that uses them (the rest of
:mod:`agentrl.warmstart`) sits above it (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from agentrl.errors import UsageError

SECTION = "trainer.sft"   # where the techniques' sections are in the configuration


def option(default: Any = None, help: str = "", *, factory: Any = None, **checks: Any) -> Any:
    """A technique's setting: default (or ``factory``), one line of help, checks (choices, min, max, gt)."""
    meta = {"help": help, **checks}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass
class DaggerOptions:
    """DAgger (agentrl.warmstart.dagger): a policy plays training tasks greedily, the env's step-wise
    expert labels every state it reaches, and SFT trains on those examples too."""

    name: ClassVar[str] = "dagger"
    title: ClassVar[str] = "DAgger: the policy plays, the env's expert labels the states it reaches"

    tasks: int = option(0, "a policy plays this many training tasks greedily and the env's step-wise expert "
                        "labels every state it reaches; those examples join the expert's demonstrations "
                        "(ALFWorld; agentrl.warmstart.dagger). With dagger.rounds=0 the starting model "
                        "(trainer.init_checkpoint) plays, before training; 0 = off", min=0)
    rounds: int = option(0, "DAgger rounds after the expert epochs: each round, the model trained so far plays "
                         "dagger.tasks tasks, and dagger.epochs at dagger.lr go over the demonstrations and every "
                         "round's labelled states, so one command warm-starts from scratch and corrects its own "
                         "mistakes; 0 = none", min=0)
    epochs: float = option(1.0, "passes over the demonstrations and labelled states in each DAgger round", gt=0)
    lr: float = option(1e-3, "peak learning rate of each DAgger round (cosine decay, like the expert epochs)", gt=0)

    def __post_init__(self):
        if self.rounds and not self.tasks:
            rounds, tasks = f"{SECTION}.{self.name}.rounds", f"{SECTION}.{self.name}.tasks"
            raise UsageError(f"{rounds}={self.rounds} needs the tasks each round's policy plays: set {tasks}=N "
                             f"(e.g. 480), or {rounds}=0")


@dataclasses.dataclass
class RecoveryOptions:
    """Recovery variants (agentrl.warmstart.demonstrations): expert episodes that overshoot a run of
    actions once, then recover."""

    name: ClassVar[str] = "recovery"
    title: ClassVar[str] = "recovery variants: the expert overshoots a run of actions, then recovers"

    variants: int = option(0, "per expert episode, up to this many recovery variants: the expert does the last "
                           "action of a run once too often (longest runs first), then goes on with its plan; only "
                           "the steps after the extra action are trained, so the policy learns to recover from an "
                           "overshoot it makes itself (docs/quickstart.md); 0 = off", min=0)


@dataclasses.dataclass
class ClassBalanceOptions:
    """Class balance (agentrl.warmstart.demonstrations): demonstrations of rare decisions repeated."""

    name: ClassVar[str] = "balance"
    title: ClassVar[str] = "class balance: demonstrations of decisions the expert takes rarely, repeated"

    action_repeats: dict = option(help="a demonstration whose action starts with KEY appears VALUE times per epoch, "
                                  "e.g. {take: 5} (ALFWorld's pick tasks have one take step in ~12; without it a "
                                  "tiny model never learned to take the goal's object, docs/benchmarks.md); a KEY "
                                  "'<kind> after <kind>' matches an action kind right after an action of the "
                                  "second kind ('go after take': ALFWorld's turn to the destination) and wins over "
                                  "the plain kind; {} = each once", factory=dict)


TECHNIQUES: dict[str, type] = {cls.name: cls for cls in (DaggerOptions, RecoveryOptions, ClassBalanceOptions)}

__all__ = ["ClassBalanceOptions", "DaggerOptions", "RecoveryOptions", "SECTION", "TECHNIQUES", "option"]
