"""The training loop, top to bottom, as the algorithm reads:

    starting policy (tiny: tokenizer + model + SFT warm start)
    estimator from the registry: its parameters, the row inputs it needs, its loss options, its state
    for each iteration k:
        rollout      tasks x G whole groups from the rollout source            -> StepBatch
                     (sync: rolled out now; one_step_off / async: rolled out ahead, at most
                     max_staleness policy versions old; agentrl.rollout.sources)
        estimate     advantages with the configured estimator                  (pure function)
        learner pass old log-probs, reference log-probs                        (one forward pass over
                     the rows the update trains on; when the estimator needs hidden states the
                     backend did not record (vLLM), the pass runs before the estimator, over every
                     row, and gives them)
        update       PPO epochs over mini-batches, the estimator's loss options (DeepSpeed ZeRO)
        push         new weights (policy version k) into the rollout workers    (agentrl.training.weight_sync)
        log / validate / checkpoint (with the rollout source's buffer)

The components it composes: the learner (``agentrl.learner``), the rollout workers and the rollout
source of ``trainer.mode`` (``agentrl.rollout``), the weight sync, the stop on failures
(``failures``) and the batch recorder for ``agentrl inspect`` (``inspection``); run-directory
bookkeeping is :mod:`agentrl.runs.directory`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Optional

from agentrl.config import Config, config_to_dict
from agentrl.estimators import Estimator, estimator_from_config
from agentrl.evaluation.plots import plot_run
from agentrl.generation import engine_gpus, planned_backend
from agentrl.learner.engine import resolve_device
from agentrl.learner.group import LearnerGroup
from agentrl.placement.reservation import reserve_for_run
from agentrl.rollout.guidance import sampled_rows_of_guided_groups
from agentrl.rollout.sources import rollout_source
from agentrl.rollout.validation import eval_tasks, validate
from agentrl.rollout.worker_group import RolloutWorkerGroup
from agentrl.runs.directory import CheckpointNotWritten, RunDirectory, TrainerState
from agentrl.runs.task_schedule import TaskSchedule
from agentrl.runs.tracking import GpuMemory, Phases, Tracker
from agentrl.runtime.ray_start import start_ray
from agentrl.training.cpu_cores import core_policy, prepare_local_learner, rollout_thread_shares
from agentrl.training.failures import FailureStop
from agentrl.training.inspection import BatchRecorder, rollout_hidden_layer
from agentrl.training.metrics import PromptCutWarning, episode_metrics, rollout_logprob_gap
from agentrl.training.modes import check_mode_layout, warn_if_uncorrected
from agentrl.training.weight_sync import weight_sync_for
from agentrl.warmstart.starting_policy import starting_policy


def guided_advantages(batch, advantages):
    """The estimator's advantages, with the failed sampled episodes of expert-guided groups put back
    to 0, as they were without guidance (see :mod:`agentrl.rollout.guidance`)."""
    if not bool(batch.is_expert.any()):
        return advantages
    return advantages.masked_fill(sampled_rows_of_guided_groups(batch), 0.0)


def rows_to_train(batch, skip_zero_advantage: bool):
    """The step records the update trains on, and their share of the batch.

    With ``skip_zero_advantage`` rows whose advantage is exactly 0 are dropped (their policy-gradient
    term is zero; ``trainer.filter_groups`` drops whole groups without signal and refills them).
    """
    if not skip_zero_advantage or len(batch) == 0:
        return batch, 1.0
    keep = batch.advantages != 0
    return batch.select(keep), float(keep.float().mean())


def checkpoint_due(iteration: int, trainer_cfg) -> bool:
    """Whether iteration ``iteration`` ends with a checkpoint: every ``trainer.save_every`` iterations,
    and after the last one unless ``trainer.final_checkpoint`` is off (then not even when
    ``save_every`` divides it)."""
    if iteration == trainer_cfg.iterations:
        return bool(trainer_cfg.final_checkpoint)
    return bool(trainer_cfg.save_every) and iteration % trainer_cfg.save_every == 0


class Trainer:
    def __init__(self, cfg: Config, recipe: str | None):
        self.cfg = cfg
        self.run = RunDirectory.create(cfg, recipe)
        self.tracker = Tracker(self.run.path, cfg.logging, self.run.name, config_dict=config_to_dict(cfg))
        self.estimator: Estimator = estimator_from_config(cfg.algorithm)
        self.estimator_state: Any = None
        self.state = TrainerState()
        self.learner = self.rollout = self.weights = self.source = self.recorder = None
        self.placement = None     # the placement group of a GPU run (agentrl.placement.reservation)
        self.memory = None        # GPU memory per phase, on a GPU
        self.finished = 0         # the last iteration whose update the learner holds
        self.stops = FailureStop(self.run, self.tracker, self.checkpoint)
        self.prompt_cuts = PromptCutWarning()

    # ----- setup ---------------------------------------------------------------------------------
    def reserve_placement(self) -> None:
        """GPU runs: the placement plan, reserved before anything starts (agentrl.placement); CPU runs have none."""
        if self.learner_device() == "cuda":
            self.placement = reserve_for_run(self.cfg, log=self.tracker.status)

    def prepare_policy(self) -> str:
        """The starting policy as a model directory (tiny: trained tokenizer, model, SFT warm start)."""
        return starting_policy(self.cfg, self.run, log=lambda m: self.tracker.log(m, step=0),
                               status=self.tracker.status)

    def build(self, model_dir: str) -> None:
        """Learner, rollout workers (with their env servers), weight sync and rollout source."""
        cfg = self.cfg
        start_ray(cfg)
        device = self.learner_device()
        on_cpu_here = prepare_local_learner(cfg, device)     # a one-rank CPU learner runs in this process
        slots = self.placement
        # the ranks write their checkpoint files into the run directory: they prove first that it is this one
        self.learner = LearnerGroup(cfg, model_dir, slots=slots.learner_slots if slots else None,
                                    shared_directory=str(self.run.path))
        self.memory = GpuMemory.for_device(device)
        self.rollout = RolloutWorkerGroup(
            model_dir, cfg.rollout, cfg.env, device=device, env_url=cfg.env.server_url,
            dtype=cfg.model.dtype if device == "cuda" else "float32",
            num_gpus_per_worker=float(engine_gpus(cfg.rollout, device)),
            hidden_layer=rollout_hidden_layer(cfg, self.estimator),
            thread_shares=rollout_thread_shares(cfg),
            worker_resources=cfg.placement.rollout, env_resources=cfg.placement.env,
            worker_slots=slots.rollout_slots if slots else None, env_slots=slots.env_slots if slots else None)
        self.weights = weight_sync_for(cfg, self.learner, self.rollout, device,
                                       colocated=slots is not None and slots.colocated,
                                       backend_paths=planned_backend(cfg.rollout).weight_paths)
        self.tracker.status(f"weight sync: {self.weights.name} (rollout.weight_sync={cfg.rollout.weight_sync})")
        check_mode_layout(cfg, self.weights)
        warn_if_uncorrected(cfg)
        self.weights.connect()
        schedule = TaskSchedule.for_split(cfg.env, cfg.trainer.seed)
        self.source = rollout_source(cfg, self.rollout, schedule.tasks_for)
        if on_cpu_here:
            self.learner.set_thread_policy(core_policy(cfg, self.source.busy))
        self.recorder = BatchRecorder(cfg, self.run, model_dir)

    def learner_device(self) -> str:
        return "cuda" if resolve_device(self.cfg.trainer.device) == "cuda" else "cpu"

    # ----- the loop ------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        self.state = self.run.load_latest() or TrainerState()
        done = self.state.iteration
        self.reserve_placement()
        self.state.model_dir = self.state.model_dir or self.prepare_policy()
        self.build(self.state.model_dir)
        if done > 0:
            self.learner.load_checkpoint(str(self.run.learner_checkpoint(done)))
            self.tracker.status(f"resumed {self.run.name} after iteration {done}")
        self.finished = done
        self.weights.push(version=done)
        restored = self.source.start(done, self.run.checkpoint_dir(done) / "rollout_buffer" if done else None)
        if restored:
            self.tracker.status(restored)
        self.estimator_state = self.estimator.restore_state(self.state.estimator_state)
        if done == 0 and cfg.trainer.eval_before_train and cfg.trainer.eval_every > 0:
            self.validate(0)
        self.loop(done + 1)
        self.plot()
        if not cfg.trainer.final_checkpoint:
            self.tracker.status("no final checkpoint or final model (trainer.final_checkpoint=false)")
            return {"run_dir": str(self.run.path), "final_model": None}
        final = self.run.path / "final_model"
        t = time.perf_counter()
        self.learner.export_hf(str(final))
        self.tracker.status(f"final model exported in {time.perf_counter() - t:.1f}s: {final}")
        return {"run_dir": str(self.run.path), "final_model": str(final)}

    def loop(self, first: int) -> None:
        """Iterations ``first`` ... ``trainer.iterations``, each logged, validated and saved when due; a
        failure in any of it stops the run cleanly (:class:`~agentrl.training.failures.FailureStop`)."""
        cfg = self.cfg
        for k in range(first, cfg.trainer.iterations + 1):
            with self.stops.guard(k, finished=lambda: self.finished):
                metrics = self.iteration(k)
                self.tracker.log(metrics, k)
                self.tracker.status(f"iter {k}/{cfg.trainer.iterations} success {metrics['rollout/success_rate']:.2f} "
                                    f"(rollout {metrics['time/rollout_s']:.1f}s, learner {metrics['time/update_s']:.1f}s)")
                if cfg.trainer.eval_every and k % cfg.trainer.eval_every == 0:
                    self.validate(k)
                    self.plot()
                if checkpoint_due(k, cfg.trainer):
                    self.checkpoint(k, wait_for_next=k != cfg.trainer.iterations)

    def iteration(self, k: int) -> dict[str, float]:
        cfg, estimator = self.cfg, self.estimator
        phase = Phases(self.memory, always=("learner_pass",))     # seconds (and GPU memory) per phase
        with phase("rollout"):
            taken = self.source.next_batch(k)
        with phase("sleep"):
            self.source.sleep()

        # an estimator that reads hidden states gets them from the rollout backend's prefill; when
        # the rollout brought none (vLLM) the learner pass runs before the estimator, over every row.
        # Otherwise the pass runs after the estimator, over the rows the update trains on
        batch = taken.result.batch
        hidden_layer = estimator.row_inputs().hidden_layer
        pass_first = hidden_layer is not None and batch.hidden is None
        if pass_first:
            with phase("learner_pass"):
                batch = self.learner.compute_logprobs(batch, hidden_layer=hidden_layer)

        with phase("estimate"):
            advantages, diagnostics = estimator.advantages(batch, self.estimator_state)
            batch = batch.with_columns(advantages=guided_advantages(batch, advantages))
        saved = {}
        if self.recorder.wants(k):
            with phase("save_batch"):
                saved = self.recorder.save(k, batch, taken.result)
        batch, kept = rows_to_train(batch, cfg.learner.skip_zero_advantage)

        if not pass_first and len(batch):
            with phase("learner_pass"):
                batch = self.learner.compute_logprobs(batch)

        with phase("update"):
            # a batch without a trained row (every advantage 0 and skipped) makes no optimizer step
            update = (self.learner.update(batch, estimator.loss_options(), version=k - 1) if len(batch)
                      else {"optimizer_steps": 0.0})
        self.finished = k       # the learner holds update k: a failure from here on saves iteration k

        with phase("sync"):
            self.source.before_push()
            self.weights.push(version=k)

        metrics = episode_metrics(taken.result)
        self.prompt_cuts.check(metrics, k, cfg.rollout.max_prompt_tokens)
        metrics.update(taken.metrics)
        metrics.update({f"estimator/{key}": value for key, value in diagnostics.items()})
        metrics.update({f"learner/{key}": value for key, value in update.items()})
        metrics["learner/trained_row_fraction"] = kept
        if cfg.learner.recompute_logprobs:      # otherwise the old log-probs are the rollout's: no gap to show
            metrics.update(rollout_logprob_gap(batch))
        metrics.update(saved)
        metrics.update(phase.metrics())
        return metrics

    # ----- checkpoints, validation, plots --------------------------------------------------------
    def checkpoint(self, iteration: int, wait_for_next: bool = True) -> Optional[Path]:
        """Write the checkpoint of ``iteration`` with the rollout source's state (``wait_for_next``: once
        the next iteration's groups have arrived, where the source can wait for them). On a full disk,
        say so and go on training: ``latest`` still names the last complete checkpoint."""
        t = time.perf_counter()
        if wait_for_next:
            self.source.wait_for_next()
        estimator_state = self.estimator_state.as_dict() if self.estimator_state is not None else None
        self.state = dataclasses.replace(self.state, iteration=iteration, estimator_state=estimator_state)
        try:
            where = self.run.save(self.state, self.learner, lambda d: self.source.save(d / "rollout_buffer"))
        except CheckpointNotWritten as err:
            self.tracker.log({"checkpoint/not_written": 1.0}, iteration)
            print(f"agentrl: warning: {err}", file=sys.stderr, flush=True)
            return None
        self.tracker.status(f"checkpoint after iteration {iteration} written in {time.perf_counter() - t:.1f}s")
        return where

    def validate(self, iteration: int) -> dict[str, float]:
        cfg = self.cfg
        split = cfg.eval.split or cfg.env.eval_split
        tasks = eval_tasks(TaskSchedule.split_sizes(cfg.env), split, cfg.eval.num_tasks)
        t = time.perf_counter()
        with self.source.paused():
            results = [validate(self.rollout, tasks, temperature=cfg.eval.temperature, seed=seed)
                       for seed in cfg.eval.seeds]
        self.run.write_validation(iteration, {seed: r.episodes for seed, r in zip(cfg.eval.seeds, results)})
        metrics: dict[str, float] = {}
        for key in results[0].metrics("val/"):
            values = [r.metrics("val/").get(key, 0.0) for r in results]
            metrics[key] = sum(values) / len(values)
        metrics["time/validation_s"] = time.perf_counter() - t
        self.tracker.log(metrics, iteration)
        self.tracker.status(f"validation at iter {iteration}: success {metrics['val/success_rate']:.3f} "
                            f"on {len(tasks)} {split} tasks x {len(results)} seed(s)")
        return metrics

    def plot(self) -> None:
        """The run's learning_curve.png, redrawn from metrics.jsonl (a failure is a warning: it must
        not end a run)."""
        try:
            plot_run(self.run.path, self.run.name)
        except Exception as err:  # noqa: BLE001
            print(f"agentrl: warning: learning_curve.png not drawn ({type(err).__name__}: {err})", file=sys.stderr)

    def close(self) -> None:
        for part in (self.memory, self.source, self.rollout):
            if part is not None:
                part.close()
        if self.learner is not None:
            self.learner.shutdown()
        if self.placement is not None:
            self.placement.release()
        self.tracker.close()


def train(cfg: Config, recipe: str | None) -> dict[str, Any]:
    trainer = Trainer(cfg, recipe)
    try:
        return trainer.train()
    finally:
        trainer.close()
