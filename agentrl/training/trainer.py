"""The training loop, top to bottom, as the algorithm reads:

    starting policy (tiny: tokenizer + model + SFT warm start)
    estimator from the registry: its parameters, the row inputs it needs, its loss options, its state
    for each iteration:
        rollout      tasks x G episodes through the env servers          -> StepBatch
                     (with the hidden state the estimator asks for, when the backend records it);
                     trainer.mode one_step_off / async: the rollout calls ran ahead while the learner
                     updated, and the iteration takes the next whole groups from their buffer
                     (at most max_staleness policy versions old: agentrl.rollout.stream)
        estimate     advantages with the configured estimator            (pure function)
        learner pass old log-probs, reference log-probs                  (one forward pass over
                     the rows the update trains on; when the estimator needs hidden states the
                     backend did not record (vLLM), the pass runs before the estimator, over every
                     row, and gives them)
        update       PPO epochs over mini-batches, the estimator's loss options  (DeepSpeed ZeRO)
        sync         new weights (policy version = iteration) into the rollout workers (waking
                     an engine that slept through the learner's passes, rollout.vllm.sleep_level;
                     async: a worker in the middle of a rollout loads them at its next env step)
        log / validate / checkpoint (with the rollout buffer in one_step_off / async)

Components live elsewhere (``agentrl.rollout``, ``agentrl.learner``, ``agentrl.estimators``);
run-directory bookkeeping (checkpoints, resume) is in :mod:`agentrl.runs.directory`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Optional

from agentrl.config import Config, config_to_dict
from agentrl.runtime.denormals import warn_unless_flushed
from agentrl.errors import UsageError
from agentrl.estimators import Estimator, estimator_from_config, registered_names
from agentrl.runtime.ray_start import start_ray
from agentrl.rollout.engine import EnvFailureLimitError
from agentrl.rollout.workers import RolloutHangError
from agentrl.rollout.guidance import sampled_rows_of_guided_groups
from agentrl.runs.directory import CheckpointNotWritten, RunDirectory, TrainerState
from agentrl.runs.task_schedule import TaskSchedule
from agentrl.runs.tracking import GpuMemory, Phases, Tracker


def rollout_hidden_layer(cfg: Config, estimator: Estimator) -> int | None:
    """The hidden-state layer the rollout records: the estimator's (its ``row_inputs``), or, when
    batches are saved for ``agentrl inspect``, the first one an estimator of the registry reads with
    this config, so the page can show every estimator on the saved batch."""
    layer = estimator.row_inputs().hidden_layer
    if layer is None and cfg.logging.save_batches:
        layers = (estimator_from_config(cfg.algorithm, name).row_inputs().hidden_layer for name in registered_names())
        layer = next((candidate for candidate in layers if candidate is not None), None)
    return layer


def weight_sync_path(cfg: Config, learner_device: str, learner_gpu: str | None,
                     rollout_gpus: list[str | None]) -> str:
    """``ipc`` (CUDA IPC handles: nothing leaves the GPU) when ``rollout.weight_sync`` asks for it or,
    with ``auto``, when it applies: one learner rank on a GPU with ZeRO <= 2 and every rollout worker on
    that same GPU (``*_gpu``: device UUIDs). ``auto`` otherwise: ``broadcast`` (NCCL from the learner's
    rank 0) on GPUs, ``packed`` (host buckets through Ray) on CPU. ``broadcast`` and ``packed`` as asked."""
    applies = (learner_device == "cuda" and cfg.learner.num_ranks == 1 and cfg.learner.zero_stage < 3
               and learner_gpu is not None and bool(rollout_gpus) and all(g == learner_gpu for g in rollout_gpus))
    wanted = cfg.rollout.weight_sync
    if wanted == "ipc" and not applies:
        raise UsageError("rollout.weight_sync=ipc needs one learner rank (learner.num_ranks=1) on a GPU with "
                         "learner.zero_stage <= 2 and every rollout worker on the learner's GPU; set "
                         "rollout.weight_sync=auto (or packed) for this layout")
    if wanted != "auto":
        return wanted
    return "ipc" if applies else "broadcast" if learner_device == "cuda" else "packed"


def check_overlap_layout(cfg: Config, weight_sync: str) -> None:
    """``trainer.mode`` one_step_off and async keep the rollout engines running while the learner
    works, which a colocated layout (an engine that sleeps for the learner, CUDA IPC weights that
    the learner reuses) cannot do."""
    mode = cfg.trainer.mode
    if mode == "sync":
        return
    if cfg.rollout.vllm.sleep_level:
        raise UsageError(f"trainer.mode={mode} keeps the rollout running while the learner updates, so the engine "
                         "cannot sleep: set rollout.vllm.sleep_level=0 (and give the rollout its own GPUs), or "
                         "trainer.mode=sync")
    if weight_sync == "ipc":
        raise UsageError(f"trainer.mode={mode} loads weights while a rollout runs, which CUDA IPC weights cannot "
                         "wait for: set rollout.weight_sync=broadcast (or auto), or trainer.mode=sync")


def learner_threads(cfg: Config) -> int | None:
    """CPU threads of a one-rank learner in this process (``learner.torch_threads``): None leaves
    torch's default; with one_step_off/async the cores are shared with the rollout workers (this is
    the learner's share; :meth:`Trainer.lend_idle_cores` gives it every core while they are idle)."""
    from agentrl.rollout.workers import available_cores

    if cfg.learner.torch_threads:
        return cfg.learner.torch_threads
    if cfg.trainer.mode == "sync":
        return None
    return max(1, available_cores() // (cfg.rollout.num_workers + 1))


def ray_failures() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call to an actor whose process (or node) is gone, and for a task that failed
    (a surviving learner rank's collective fails when its peer's node is lost)."""
    from ray.exceptions import RayActorError, RayTaskError

    return RayActorError, RayTaskError


def rollout_seed(cfg: Config, iteration: int) -> int:
    """The sampling seed of iteration ``iteration``'s rollout (of rollout call ``iteration``)."""
    return cfg.trainer.seed * 1_000_003 + iteration


def episode_metrics(result, prefix: str = "rollout/") -> dict[str, float]:
    from agentrl.rollout.validation import summarize

    summary = summarize(result.episodes)
    metrics = summary.metrics(prefix)
    batch = result.batch
    metrics[f"{prefix}step_records"] = float(len(batch))
    metrics[f"{prefix}env_steps"] = float((~batch.is_expert).sum())     # sampled steps (expert-guided ones left out)
    metrics[f"{prefix}response_tokens"] = float(batch.response_mask.sum())
    metrics[f"{prefix}mixed_outcome_groups"] = _mixed_groups(result.episodes)
    for key in ("env_failures", "episodes_rerun", "episodes_masked", "guided_episodes", "generated_tokens",
                "truncated_prompts", "noop_actions"):
        metrics[f"{prefix}{key}"] = float(result.stats.get(key, 0.0))
    # valid actions the environment answered with "nothing changed" (ALFWorld's "Nothing happens.")
    metrics[f"{prefix}noop_rate"] = metrics[f"{prefix}noop_actions"] / max(1.0, float(result.stats.get("env_steps", 0)))
    # where the rollout's time went (seconds summed over the rollout workers, which run in parallel)
    for key in ("generate_s", "env_s", "prompt_s"):
        metrics[f"time/rollout_{key}"] = float(result.stats.get(key, 0.0))
    # how long the rollout workers had been idle before these calls (summed over workers): in sync
    # mode while the learner worked; with one_step_off/async while they waited for the next call
    metrics["time/rollout_wait_s"] = float(result.stats.get("idle_before_s", 0.0))
    return metrics


def guided_advantages(batch, advantages):
    """The estimator's advantages, with the failed sampled episodes of expert-guided groups put back
    to 0, as they were without guidance (see :mod:`agentrl.rollout.guidance`)."""
    if not bool(batch.is_expert.any()):
        return advantages
    return advantages.masked_fill(sampled_rows_of_guided_groups(batch), 0.0)


def rollout_logprob_gap(batch) -> dict[str, float]:
    """How far the learner's log-probs of the sampled tokens (``old_logprobs``, before the update)
    are from the ones the rollout backend reported: mean and max absolute difference over the
    sampled response tokens. Near 0 when the backend runs the learner's weights in the same
    precision; bf16 generation (vLLM, the torch backend on GPU) shows as a small gap, a weight sync
    that did not arrive as a large one. Expert-guided rows are left out: nothing sampled their
    tokens, so their rollout log-probs are 0."""
    if len(batch) == 0 or batch.old_logprobs is None:
        return {}
    sampled = ~batch.is_expert.unsqueeze(1) & (batch.response_mask > 0)
    if not bool(sampled.any()):
        return {}
    gap = (batch.old_logprobs.float() - batch.rollout_logprobs.float()).abs()[sampled]
    return {"learner/rollout_logprob_gap_mean": float(gap.mean()), "learner/rollout_logprob_gap_max": float(gap.max())}


def rows_to_train(batch, skip_zero_advantage: bool):
    """The step records the update trains on, and their share of the batch.

    With ``skip_zero_advantage`` rows whose advantage is exactly 0 are dropped (their policy-gradient
    term is zero; DAPO filters such groups the same way, without re-sampling to refill the batch).
    """
    if not skip_zero_advantage or len(batch) == 0:
        return batch, 1.0
    keep = batch.advantages != 0
    return batch.select(keep), float(keep.float().mean())


def saved_state(state: TrainerState, iteration: int, estimator_state: Any) -> TrainerState:
    """What a checkpoint after ``iteration`` records besides the weights."""
    return dataclasses.replace(state, iteration=iteration,
                               estimator_state=estimator_state.as_dict() if estimator_state is not None else None)


def _mixed_groups(episodes) -> float:
    by_group: dict[int, set[bool]] = {}
    for e in episodes:
        by_group.setdefault(e.group_id, set()).add(bool(e.won))
    return float(sum(len(v) == 2 for v in by_group.values()))


class Trainer:
    def __init__(self, cfg: Config, recipe: str | None):
        self.cfg = cfg
        self.run = RunDirectory.create(cfg, recipe)
        self.tracker = Tracker(self.run.path, cfg.logging, self.run.name, config_dict=config_to_dict(cfg))
        self.estimator: Estimator = estimator_from_config(cfg.algorithm)
        self.rollout = None
        self.learner = None
        self.tokenizer = None     # decodes the responses of the batches saved for agentrl inspect
        self.memory = None        # GPU memory per phase, on a GPU
        self.weight_sync = "packed"   # or "ipc", "broadcast": weight_sync_path
        self.broadcast_layout = None
        self.stream = None        # RolloutStream: the calls ahead of the learner (one_step_off, async)

    # ----- setup ---------------------------------------------------------------------------------
    def prepare_policy(self) -> str:
        """The starting policy as a model directory (tiny: trained tokenizer, model, SFT warm start)."""
        from agentrl.warmstart.starting_policy import starting_policy

        return starting_policy(self.cfg, self.run, log=lambda m: self.tracker.log(m, step=0),
                               status=self.tracker.status)

    def build(self, model_dir: str) -> None:
        from agentrl.learner.group import LearnerGroup
        from agentrl.rollout.workers import RolloutWorkerGroup

        cfg = self.cfg
        start_ray(cfg)
        self.warn_if_local_learner_keeps_denormals()
        device = "cuda" if self.learner_device() == "cuda" else "cpu"
        threads = learner_threads(cfg) if device == "cpu" and cfg.learner.num_ranks == 1 else None
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.learner = LearnerGroup(cfg, model_dir)
        self.memory = GpuMemory.for_device(self.learner_device())
        gpus_per_worker = float(cfg.rollout.vllm.tensor_parallel_size) if device == "cuda" else 0.0
        overlapped = cfg.trainer.mode != "sync"
        self.rollout = RolloutWorkerGroup(model_dir, cfg.rollout, cfg.env, device=device,
                                          env_url=cfg.env.server_url,
                                          dtype=cfg.model.dtype if device == "cuda" else "float32",
                                          num_gpus_per_worker=gpus_per_worker,
                                          hidden_layer=rollout_hidden_layer(cfg, self.estimator),
                                          # the learner runs at the same time: one more share of the cores
                                          thread_shares=cfg.rollout.num_workers + 1 if overlapped else None,
                                          worker_resources=cfg.placement.rollout, env_resources=cfg.placement.env)
        if device == "cuda":
            from agentrl.weights.transfer import device_uuid

            self.weight_sync = weight_sync_path(cfg, device, device_uuid(), self.rollout.gpu_uuids())
        else:
            self.weight_sync = weight_sync_path(cfg, device, None, [])
        check_overlap_layout(cfg, self.weight_sync)
        if self.weight_sync == "broadcast":     # the learner's rank 0 and the workers form one group, once
            members = self.rollout.num_workers + 1
            host, port = self.learner.weight_broadcast_address(members)
            self.broadcast_layout = self.learner.weight_broadcast_layout()
            joining = self.rollout.join_weight_broadcast(host, port)
            self.learner.join_weight_broadcast(host, port, members)
            self.rollout.wait(joining)
        if self.cfg.logging.save_batches:
            from agentrl.models import load_tokenizer

            self.tokenizer = load_tokenizer(model_dir)

    def warn_if_local_learner_keeps_denormals(self) -> None:
        """A one-rank CPU learner runs in this process: warn when its floats are not flushed (the
        agentrl command flushes them; Ray learner ranks flush their own, agentrl.runtime.denormals)."""
        if self.learner_device() == "cpu" and self.cfg.learner.num_ranks == 1:
            warn_unless_flushed()

    def learner_device(self) -> str:
        from agentrl.learner.engine import resolve_device

        return resolve_device(self.cfg.trainer.device)

    # ----- the loop ------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        state = self.run.load_latest() or TrainerState()
        model_dir = state.model_dir or self.prepare_policy()
        state.model_dir = model_dir
        self.build(model_dir)
        if state.iteration > 0:
            self.learner.load_checkpoint(str(self.run.learner_checkpoint(state.iteration)))
            self.tracker.status(f"resumed {self.run.name} after iteration {state.iteration}")
        self.sync_weights(version=state.iteration)
        schedule = TaskSchedule.for_split(cfg.env, cfg.trainer.seed)
        if cfg.trainer.mode != "sync":
            self.start_stream(schedule, state.iteration)
        estimator_state = self.estimator.restore_state(state.estimator_state)
        if state.iteration == 0 and cfg.trainer.eval_before_train and cfg.trainer.eval_every > 0:
            self.validate(0)
        for iteration in range(state.iteration + 1, cfg.trainer.iterations + 1):
            try:
                metrics = self.iteration(iteration, schedule, estimator_state)
            except (EnvFailureLimitError, RolloutHangError) as err:
                self.stop_on_rollout_failure(iteration, state, estimator_state, err)
            except ray_failures() as err:     # an actor's process or its whole Ray node was lost
                self.stop_on_lost_actor(iteration, err)
            self.tracker.log(metrics, iteration)
            self.tracker.status(f"iter {iteration}/{cfg.trainer.iterations} "
                                f"success {metrics['rollout/success_rate']:.2f} "
                                f"(rollout {metrics['time/rollout_s']:.1f}s, learner {metrics['time/update_s']:.1f}s)")
            if cfg.trainer.eval_every and iteration % cfg.trainer.eval_every == 0:
                self.validate(iteration)
                self.plot()
            last = iteration == cfg.trainer.iterations
            if last or (cfg.trainer.save_every and iteration % cfg.trainer.save_every == 0):
                state = saved_state(state, iteration, estimator_state)
                self.checkpoint(state)
        self.plot()
        final = self.run.path / "final_model"
        t = time.perf_counter()
        self.learner.export_hf(str(final))
        self.tracker.status(f"final model exported in {time.perf_counter() - t:.1f}s: {final}")
        return {"run_dir": str(self.run.path), "final_model": str(final)}

    def start_stream(self, schedule: TaskSchedule, done: int) -> None:
        """The rollout calls of one_step_off/async, numbered like iterations; after a resume, the
        checkpoint's buffered groups, and the calls that were in flight submitted again."""
        from agentrl.rollout.stream import RolloutStream

        cfg = self.cfg
        self.stream = RolloutStream(self.rollout, schedule.tasks_for, lambda call: rollout_seed(cfg, call),
                                    cfg.env.group_size, cfg.env.tasks_per_iteration,
                                    expert_guidance=cfg.rollout.expert_guidance, next_call=done + 1)
        self.lend_idle_cores()
        saved = self.run.checkpoint_dir(done) / "rollout_buffer"
        if done > 0 and saved.is_dir():
            groups = self.stream.restore(saved)
            self.tracker.log({"async/groups_restored": float(groups),
                              "async/calls_resubmitted": float(self.stream.resubmitted)}, done)
            self.tracker.status(f"restored {groups} buffered groups; {self.stream.resubmitted} rollout calls that "
                                "were in flight run again")

    def lend_idle_cores(self) -> None:
        """one_step_off/async on CPU, the learner in this process, ``learner.torch_threads=0``: the
        learner runs on its share of the cores while a rollout call runs and on every core while
        none does (switched before each micro-batch)."""
        from agentrl.rollout.workers import available_cores

        local = self.learner.local
        if self.cfg.learner.torch_threads or local is None or self.learner_device() != "cpu":
            return
        share, every = learner_threads(self.cfg), available_cores()
        if every > share:
            local.threads_now = lambda: share if self.stream.running() else every

    def max_staleness(self) -> int:
        return 1 if self.cfg.trainer.mode == "one_step_off" else self.cfg.trainer.max_staleness

    def next_groups(self, iteration: int):
        """one_step_off/async: rollout calls submitted up to ``max_staleness`` iterations ahead, then
        the next whole groups for the learner at policy version ``iteration - 1``."""
        cfg = self.cfg
        needed = (cfg.trainer.iterations - iteration + 1) * cfg.env.tasks_per_iteration
        self.stream.submit_until(iteration + self.max_staleness(), needed)
        return self.stream.next_batch(iteration - 1, self.max_staleness())

    def checkpoint(self, state: TrainerState, wait_for_next: bool = True) -> Optional[Path]:
        """Write the checkpoint of ``state.iteration``. On a full disk, say so and go on training:
        ``latest`` still names the last complete checkpoint, and stopping would lose more.

        With one_step_off/async the rollout buffer is saved with it, once the next iteration's call
        has arrived (``wait_for_next``; the learner waits for it next anyway), so a resumed run trains
        the next iteration on exactly the groups the uninterrupted run does."""
        t = time.perf_counter()
        extra = None
        if self.stream is not None:
            if wait_for_next and state.iteration < self.cfg.trainer.iterations:
                self.stream.wait_for_call(state.iteration + 1)
            extra = lambda directory: self.stream.save(directory / "rollout_buffer")  # noqa: E731
        try:
            where = self.run.save(state, self.learner, extra)
        except CheckpointNotWritten as err:
            self.tracker.log({"checkpoint/not_written": 1.0}, state.iteration)
            print(f"agentrl: warning: {err}", file=sys.stderr, flush=True)
            return None
        self.tracker.status(f"checkpoint after iteration {state.iteration} written in {time.perf_counter() - t:.1f}s")
        return where

    def iteration(self, iteration: int, schedule: TaskSchedule, estimator_state: Any) -> dict[str, float]:
        cfg = self.cfg
        phase = Phases(self.memory, always=("learner_pass",))     # seconds (and GPU memory) per phase
        stream_metrics: dict[str, float] = {}

        if self.stream is None:         # trainer.mode=sync: this iteration's rollout, now
            with phase("rollout"):
                result = self.rollout.run(schedule.tasks_for(iteration), cfg.env.group_size,
                                          seed=rollout_seed(cfg, iteration), expert_guidance=cfg.rollout.expert_guidance)
            # colocated layout: the rollout engine frees its GPU memory for the learner's passes
            # (rollout.vllm.sleep_level); the weight sync below wakes it
            with phase("sleep"):
                self.rollout.sleep()
        else:                           # one_step_off/async: the calls ran ahead; wait for whole groups
            with phase("rollout"):
                taken = self.next_groups(iteration)
            result, stream_metrics = taken.result, taken.metrics()

        # an estimator that reads hidden states gets them from the rollout backend's prefill; when
        # the rollout brought none (vLLM) the learner pass runs before the estimator, over every row.
        # Otherwise the pass runs after the estimator, over the rows the update trains on (with
        # skip_zero_advantage, often half or fewer)
        estimator, batch = self.estimator, result.batch
        hidden_layer = estimator.row_inputs().hidden_layer
        pass_first = hidden_layer is not None and batch.hidden is None
        if pass_first:
            with phase("learner_pass"):
                batch = self.learner.compute_logprobs(batch, hidden_layer=hidden_layer)

        with phase("estimate"):
            advantages, diagnostics = estimator.advantages(batch, estimator_state)
            batch = batch.with_columns(advantages=guided_advantages(batch, advantages))
        saved = {}
        if cfg.logging.save_batches and iteration % cfg.logging.save_batches == 0:
            with phase("save_batch"):
                saved = self.save_batch(iteration, batch, result)
        batch, kept = rows_to_train(batch, cfg.learner.skip_zero_advantage)

        if not pass_first and len(batch):
            with phase("learner_pass"):
                batch = self.learner.compute_logprobs(batch)

        with phase("update"):
            # a batch without a trained row (every advantage 0 and skipped) makes no optimizer step
            update = self.learner.update(batch, estimator.loss_options()) if len(batch) else {"optimizer_steps": 0.0}

        with phase("sync"):
            if cfg.trainer.mode == "one_step_off":     # the call in flight finishes on the weights it began with
                self.stream.wait_for_all()
            self.sync_weights(version=iteration)

        metrics = episode_metrics(result)
        metrics.update(stream_metrics)
        metrics.update({f"estimator/{k}": v for k, v in diagnostics.items()})
        metrics.update({f"learner/{k}": v for k, v in update.items()})
        metrics["learner/trained_row_fraction"] = kept
        if cfg.learner.recompute_logprobs:      # otherwise the old log-probs are the rollout's: no gap to show
            metrics.update(rollout_logprob_gap(batch))
        metrics.update(saved)
        metrics.update(phase.metrics())
        return metrics

    def sync_weights(self, version: int) -> None:
        """The learner's weights into every rollout worker, as policy ``version`` (``weight_sync_path``)."""
        if self.weight_sync == "ipc":
            self.rollout.load_weights_ipc(self.learner.ipc_weights_for_rollout(), version=version)
            self.learner.release_ipc_weights()
        elif self.weight_sync == "broadcast":
            receiving = self.rollout.receive_weights(self.broadcast_layout, version=version)
            self.learner.broadcast_weights(self.broadcast_layout)
            self.rollout.wait(receiving)
        else:
            self.rollout.load_weights(self.learner.packed_weights_for_rollout(), version=version)

    def save_batch(self, iteration: int, batch, result) -> dict[str, float]:
        """Save the estimated batch, its decoded responses and episodes for ``agentrl inspect``."""
        from agentrl.evaluation.inspector import save_batch

        lengths = (batch.response_mask > 0).sum(dim=1).tolist()
        responses = self.tokenizer.batch_decode([ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)])
        episodes = [{"traj_id": e.traj_id, "group_id": e.group_id, "task": e.task.to_dict(), "task_type": e.task_type,
                     "won": bool(e.won), "return": e.episode_return, "length": e.length} for e in result.episodes]
        path = save_batch(self.run.path, iteration, batch, responses, episodes,
                          {"estimator": self.cfg.algorithm.estimator, "run": self.run.name})
        return {"logging/saved_batch_mb": sum(f.stat().st_size for f in path.iterdir()) / 2 ** 20}

    def plot(self) -> None:
        """The run's learning_curve.png, redrawn from metrics.jsonl (a failure is a warning: it must
        not end a run)."""
        from agentrl.evaluation.plots import plot_run

        try:
            plot_run(self.run.path, self.run.name)
        except Exception as err:  # noqa: BLE001
            print(f"agentrl: warning: learning_curve.png not drawn ({type(err).__name__}: {err})", file=sys.stderr)

    def stop_on_lost_actor(self, iteration: int, err: Exception) -> None:
        """A Ray actor died (a learner rank, a rollout worker: usually its node was lost): nothing more
        can be saved, so stop with one line naming the lost node and the last complete checkpoint."""
        from ray.exceptions import RayActorError

        from agentrl.runtime.ray_start import lost_node_text

        what = lost_node_text(err)
        if not isinstance(err, RayActorError) and not what.startswith("lost "):
            raise err       # a task failed on a healthy cluster: not a lost node
        latest = self.run.checkpoints / "latest"
        saved = (f"checkpoint {self.run.checkpoints / latest.read_text().strip()} is the last complete one"
                 if latest.is_file() else "no checkpoint had been written")
        self.tracker.status(f"stopped in iteration {iteration}: {what}")
        raise UsageError(f"training stopped in iteration {iteration}: {what}; {saved}; bring the node back "
                         "(ray start --address ...) or point placement.* at live nodes, then run the same command "
                         "again to resume") from None

    def stop_on_rollout_failure(self, iteration: int, state: TrainerState, estimator_state: Any,
                                err: Exception) -> None:
        """Save the last finished iteration (if not saved yet) and stop with one line naming the fix."""
        done = iteration - 1
        if done > 0 and (self.run.checkpoints / "latest").is_file() and \
                self.run.checkpoints.joinpath("latest").read_text().strip() == self.run.checkpoint_dir(done).name:
            where = self.run.checkpoint_dir(done)
        elif done > 0:
            where = self.checkpoint(saved_state(state, done, estimator_state), wait_for_next=False)
        else:
            where = None
        saved = (f"checkpoint {where} holds iteration {done}" if where else
                 "no iteration had finished" if done == 0 else f"iteration {done}'s checkpoint could not be written")
        cause = getattr(err, "cause", None)  # a Ray task error wraps the worker's exception
        text = str(cause if isinstance(cause, EnvFailureLimitError) else err).strip()
        message = text.splitlines()[-1] if text else type(err).__name__
        self.tracker.status(f"stopped in iteration {iteration}: {message}")
        raise UsageError(f"training stopped in iteration {iteration}: {message}; {saved}; run the same command "
                         "again to resume once " + ("the rollout workers are healthy" if isinstance(err, RolloutHangError)
                                                    else "the env servers are healthy")) from None

    def validate(self, iteration: int) -> dict[str, float]:
        from agentrl.rollout.validation import eval_tasks, validate

        cfg = self.cfg
        split = cfg.eval.split or cfg.env.eval_split
        tasks = eval_tasks(TaskSchedule.split_sizes(cfg.env), split, cfg.eval.num_tasks)
        t = time.perf_counter()
        results = [validate(self.rollout, tasks, temperature=cfg.eval.temperature, seed=seed) for seed in cfg.eval.seeds]
        metrics: dict[str, float] = {}
        for key in results[0].metrics("val/"):
            values = [r.metrics("val/").get(key, 0.0) for r in results]
            metrics[key] = sum(values) / len(values)
        metrics["time/validation_s"] = time.perf_counter() - t
        self.tracker.log(metrics, iteration)
        self.tracker.status(f"validation at iter {iteration}: success {metrics['val/success_rate']:.3f} "
                            f"on {len(tasks)} {split} tasks x {len(results)} seed(s)")
        return metrics

    def close(self) -> None:
        if self.memory is not None:
            self.memory.close()
        if self.stream is not None:
            self.stream.cancel()
        if self.rollout is not None:
            self.rollout.close()
        if self.learner is not None:
            self.learner.shutdown()
        self.tracker.close()


def train(cfg: Config, recipe: str | None) -> dict[str, Any]:
    trainer = Trainer(cfg, recipe)
    try:
        return trainer.train()
    finally:
        trainer.close()
