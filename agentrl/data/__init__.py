"""Data contract shared by rollout, learner and estimators."""

from agentrl.data.step_batch import StepBatch, segment_ids

__all__ = ["StepBatch", "segment_ids"]
