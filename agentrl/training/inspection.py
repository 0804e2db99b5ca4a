"""What the trainer keeps for ``agentrl inspect`` (``logging.save_batches``): every N-th iteration's
estimated StepBatch with its decoded responses and episodes, and the hidden states the page needs."""

from __future__ import annotations

from typing import Any

from agentrl.config import Config
from agentrl.estimators import Estimator, estimator_from_config, registered_names
from agentrl.evaluation.inspector import save_batch
from agentrl.models import load_tokenizer


def rollout_hidden_layer(cfg: Config, estimator: Estimator) -> int | None:
    """The hidden-state layer the rollout records: the estimator's (its ``row_inputs``), or, when
    batches are saved for ``agentrl inspect``, the first one an estimator of the registry reads with
    this config, so the page can show every estimator on the saved batch."""
    layer = estimator.row_inputs().hidden_layer
    if layer is None and cfg.logging.save_batches:
        layers = (estimator_from_config(cfg.algorithm, name).row_inputs().hidden_layer for name in registered_names())
        layer = next((candidate for candidate in layers if candidate is not None), None)
    return layer


class BatchRecorder:
    """Saves the estimated batch of every ``logging.save_batches``-th iteration to ``<run>/batches/``."""

    def __init__(self, cfg: Config, run, model_dir: str):
        self.every, self.run, self.estimator_name = cfg.logging.save_batches, run, cfg.algorithm.estimator
        self.tokenizer = None
        if self.every:
            self.tokenizer = load_tokenizer(model_dir)

    def wants(self, iteration: int) -> bool:
        return bool(self.every) and iteration % self.every == 0

    def save(self, iteration: int, batch, result) -> dict[str, float]:
        """Save ``batch`` (estimated), its decoded responses and ``result``'s episodes; the size saved."""
        lengths = (batch.response_mask > 0).sum(dim=1).tolist()
        responses = self.tokenizer.batch_decode([ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)])
        episodes: list[dict[str, Any]] = [
            {"traj_id": e.traj_id, "group_id": e.group_id, "task": e.task.to_dict(), "task_type": e.task_type,
             "won": bool(e.won), "return": e.episode_return, "length": e.length} for e in result.episodes]
        path = save_batch(self.run.path, iteration, batch, responses, episodes,
                          {"estimator": self.estimator_name, "run": self.run.name})
        return {"logging/saved_batch_mb": sum(f.stat().st_size for f in path.iterdir()) / 2 ** 20}


__all__ = ["BatchRecorder", "rollout_hidden_layer"]
