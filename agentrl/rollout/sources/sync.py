"""``trainer.mode=sync``: iteration k rolls out its own tasks now, on the weights of iteration k - 1;
then the engine may sleep through the learner's passes (``rollout.vllm.sleep_level``)."""

from __future__ import annotations

from agentrl.rollout.sources.base import RolloutSource, Taken, rollout_seed


class SyncRollout(RolloutSource):
    """``trainer.mode=sync``: iteration k's rollout, now, on the weights of iteration k - 1."""

    def __init__(self, workers, tasks_of, seed_of, group_size: int, expert_guidance: bool = False):
        self.workers, self.tasks_of, self.seed_of = workers, tasks_of, seed_of
        self.group_size, self.expert_guidance = group_size, expert_guidance

    @classmethod
    def from_config(cls, cfg, workers, tasks_of) -> "SyncRollout":
        return cls(workers, tasks_of, lambda iteration: rollout_seed(cfg.trainer.seed, iteration), cfg.env.group_size,
                   cfg.rollout.expert_guidance)

    def next_batch(self, iteration: int) -> Taken:
        return Taken(self.workers.run(self.tasks_of(iteration), self.group_size, seed=self.seed_of(iteration),
                                      expert_guidance=self.expert_guidance))

    def sleep(self) -> None:
        self.workers.sleep()


__all__ = ["SyncRollout"]
