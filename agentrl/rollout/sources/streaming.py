"""``trainer.mode=async``: whole groups streamed from the rollout workers as they finish.

Every rollout worker runs a :class:`~agentrl.rollout.group_pool.GroupPool` (``serve_groups``):
it plays the groups it is given, starting each as soon as ``group_size`` env instances are free,
and hands each back the moment its last episode is done. :class:`StreamingRollout`, on the
trainer's side, decides which groups exist and when:

* **Which.** Group ``g`` (numbered from 0 over the run) plays the ``g % tasks_per_iteration``-th
  task of iteration ``g // tasks_per_iteration + 1`` of the task schedule, with trajectory ids
  ``g * group_size ...``: the schedule's order, consumed faster when groups are dropped or filtered.
* **When.** With the learner at version ``v`` and ``n`` groups taken so far, at most
  ``((v + 1 + max_staleness) * tasks_per_iteration - n) * oversample`` groups are in flight or
  buffered (AReaL's bound): the ones the learner will take up to version ``v + max_staleness``, so a
  group that starts now is at most ``max_staleness`` versions old when it is trained (before a take:
  ``1 + max_staleness`` iterations' groups; right after it, ``max_staleness``). A new group goes to
  the worker with the fewest groups in hand.
* **What the learner gets.** ``next_batch(k)`` waits until ``tasks_per_iteration`` groups are
  buffered that are at most ``max_staleness`` versions behind the learner (version k - 1), dropping
  staler ones and, with ``trainer.filter_groups``, groups whose returns are all equal; each dropped
  or filtered group frees a place in flight, which a new group takes. The stalest groups are trained
  first (a slow group, episodes to the step limit, arrives behind quicker ones and would otherwise
  wait until it is dropped). When a policy gives almost only such groups (every episode fails), the filter
  gives up after ``FILTER_PATIENCE`` groups per place in the batch and the batch is completed with
  them (DAPO stops with an error there instead); ``async/groups_filtered`` shows it.

Checkpoints hold the buffered groups and the ids of the groups in flight, which a resumed run
plays again from reset (with the same tasks and ids). Validation pauses the stream: every worker
finishes the groups it started, gives back the others, and serves again afterwards.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Iterator

from agentrl.rollout.group_pool import GroupSpec
from agentrl.rollout.sources.base import RolloutSource, Taken
from agentrl.rollout.sources.buffer import GroupBuffer, TakenBatch, add_stats, merge_groups
from agentrl.rollout.worker_calls import check_progress

STATE_FILE = "stream.json"
TAKE_WAIT_S = 1.0           # how long one take call waits on a worker for a finished group
FILTER_PATIENCE = 4         # trainer.filter_groups leaves out at most this many groups per place in a batch


def signal_free(group) -> bool:
    """A group whose rows all have the same episode return: a group-relative estimator gives it
    advantage 0 everywhere (DAPO's dynamic sampling filters such groups)."""
    returns = group.batch.episode_return
    return bool((returns == returns[0]).all())


class StreamingRollout(RolloutSource):
    """Whole groups streamed from the rollout workers (see the module docstring)."""

    def __init__(self, workers, tasks_of, cfg):
        self.workers, self.tasks_of = workers, tasks_of
        self.group_size, self.per_iteration = cfg.env.group_size, cfg.env.tasks_per_iteration
        self.max_staleness = cfg.trainer.max_staleness
        self.filter = cfg.trainer.filter_groups
        self.oversample = cfg.trainer.oversample
        self.version = 0            # the learner's policy version (iteration - 1 of the batch asked for)
        self.taken = 0              # groups handed to the learner so far
        self.seed = cfg.trainer.seed
        self.expert_guidance = cfg.rollout.expert_guidance
        self.hang_timeout_s = float(cfg.rollout.hang_timeout_s)
        self.sampling = workers.sampling_params(seed=self.seed)
        self.buffer = GroupBuffer()
        self.next_group = 0
        self.in_flight: dict[int, int] = {}       # group id -> the worker playing it (or holding it, not started)
        self.serving: list = []                   # each worker's serve_groups call
        self.takes: dict[int, object] = {}        # worker -> its take_groups call in flight
        self.sessions = 0                         # serve calls of this stream (they vary the sampling seed)
        self.session = 0                          # the workers' number of the current serve call
        self.filtered_total = 0
        self.lost = 0                             # groups that came back without a record
        self.last_progress = time.monotonic()

    # ----- groups ------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg, workers, tasks_of) -> "StreamingRollout":
        return cls(workers, tasks_of, cfg)

    def spec(self, group_id: int) -> GroupSpec:
        iteration, slot = divmod(group_id, self.per_iteration)
        return GroupSpec(self.tasks_of(iteration + 1)[slot], group_id, group_id * self.group_size)

    def give(self, specs: list[GroupSpec]) -> None:
        """Hand ``specs`` to the workers, each to the one with the fewest groups in hand."""
        load = [0] * self.workers.num_workers
        for worker in self.in_flight.values():
            load[worker] += 1
        batches: dict[int, list[GroupSpec]] = {}
        for spec in specs:
            worker = min(range(len(load)), key=lambda w: load[w])
            load[worker] += 1
            self.in_flight[spec.group_id] = worker
            batches.setdefault(worker, []).append(spec)
        for worker, batch in batches.items():
            self.workers.add_groups(worker, batch, self.session)

    def limit(self) -> int:
        """How many groups may be in flight or buffered now: those the learner will take up to version
        ``version + max_staleness`` (AReaL's bound), so that a group that starts now is at most
        ``max_staleness`` versions old when it is trained; times ``trainer.oversample``."""
        room = (self.version + 1 + self.max_staleness) * self.per_iteration - self.taken
        return math.ceil(room * self.oversample)

    def admit(self) -> None:
        """New groups while fewer than the limit are in flight or buffered."""
        count = self.limit() - len(self.in_flight) - len(self.buffer)
        if count > 0:
            self.give([self.spec(g) for g in range(self.next_group, self.next_group + count)])
            self.next_group += count

    # ----- serving -----------------------------------------------------------------------------------
    def serve(self) -> None:
        self.sessions += 1
        seed = self.seed * 1_000_003 + 104_729 * self.sessions
        self.session, self.serving = self.workers.serve_groups(self.sampling, self.group_size, seed,
                                                               self.expert_guidance, self.per_iteration)
        self.takes = {}

    def collect(self, wait_s: float, raise_errors: bool = True) -> int:
        """Move finished groups into the buffer, waiting up to ``wait_s`` for some; how many arrived.
        A worker whose serving ended with an error raises it here (unless ``raise_errors`` is off: a
        checkpoint written on the way out after that error)."""
        import ray

        for worker in range(self.workers.num_workers):
            if worker not in self.takes:    # each worker answers when it has a finished group, or after TAKE_WAIT_S
                self.takes[worker] = self.workers.take_groups(worker, TAKE_WAIT_S, self.session)
        refs = list(self.takes.values()) + self.serving
        ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
        ended = [ref for ref in self.serving if ref in ready]
        if ended and raise_errors:
            ray.get(ended)      # a worker stops serving only when asked, or with its error
            raise RuntimeError(f"rollout worker {self.serving.index(ended[0])} stopped serving groups without being "
                               "asked to (its serve call returned); this is a bug in agentrl")
        arrived = 0
        for worker, ref in list(self.takes.items()):
            if ref in ready or ended:
                done, _ = ray.wait([ref], timeout=0 if ref in ready else TAKE_WAIT_S + 5)
                if not done:
                    continue
                del self.takes[worker]
                try:
                    results = ray.get(ref)
                except ray.exceptions.RayError:
                    if raise_errors:
                        raise
                    continue        # a worker that died: what it held is in flight, run again after a resume
                for result in results:
                    arrived += self.arrive(result)
        if arrived:
            self.last_progress = time.monotonic()
        return arrived

    def arrive(self, result) -> int:
        """A finished group into the buffer (one that an env failure left without a record is lost)."""
        group_id = next((e.group_id for e in result.episodes), None)
        if group_id is None and result.batch is not None:
            group_id = int(result.batch.group_id[0])
        self.in_flight.pop(group_id, None)
        if result.batch is None:       # every episode masked (rollout.on_env_failure=mask): nothing to train
            self.buffer.stats = add_stats(self.buffer.stats, result.stats)
            self.lost += 1
            return 0
        self.buffer.add(group_id // self.per_iteration + 1, result)
        return 1

    def check_progress(self) -> None:
        if self.hang_timeout_s > 0 and time.monotonic() - self.last_progress > self.hang_timeout_s / 4:
            check_progress(list(enumerate(self.workers.workers)), self.hang_timeout_s)

    # ----- the source interface ---------------------------------------------------------------------
    def start(self, done: int, saved: Path | None) -> str | None:
        restored = None
        again: list[GroupSpec] = []
        if saved is not None and (saved / STATE_FILE).is_file():
            state = json.loads((saved / STATE_FILE).read_text())
            self.buffer = GroupBuffer.load(saved, state["stats"], state["dropped_total"])
            self.next_group, self.filtered_total = int(state["next_group"]), int(state["filtered_total"])
            again = [self.spec(int(g)) for g in state["in_flight"]]
            restored = f"restored {len(self.buffer)} buffered groups; {len(again)} groups that were in flight run again"
        else:
            self.next_group = done * self.per_iteration
        self.version, self.taken = done, done * self.per_iteration
        self.serve()
        self.give(again)
        self.admit()
        return restored

    def next_batch(self, iteration: int) -> Taken:
        version = self.version = iteration - 1
        start = time.perf_counter()
        dropped = filtered = 0
        while True:
            self.collect(0.0)
            dropped += self.buffer.drop_stale(version, self.max_staleness)
            if self.filter:
                room = FILTER_PATIENCE * self.per_iteration - filtered
                flat = [g for g in self.buffer.groups if signal_free(g)][:max(0, room)]
                for group in flat:
                    self.buffer.groups.remove(group)
                filtered += len(flat)
            if len(self.buffer) >= self.per_iteration:
                break
            self.admit()
            if not self.collect(TAKE_WAIT_S):
                self.check_progress()
        taken, staleness = self.buffer.take(self.per_iteration, version)
        self.taken += len(taken)
        self.filtered_total += filtered
        self.admit()
        batch = TakenBatch(merge_groups(taken, self.buffer.drain_stats()), staleness, dropped,
                           time.perf_counter() - start, len(self.buffer), self.buffer.dropped_total)
        metrics = batch.metrics()
        metrics.update({"async/groups_filtered": float(filtered), "async/groups_filtered_total": float(self.filtered_total),
                        "async/groups_in_flight": float(len(self.in_flight)), "async/groups_lost_total": float(self.lost)})
        return Taken(batch.result, metrics)

    def busy(self) -> bool:
        """Whether a worker still plays (or holds unstarted) groups. The groups finished since the last
        take are collected first, without waiting: else a group finished while the learner updates
        counts as playing until the next take, and the learner never borrows the rollout's cores
        (measured: a one-thread learner bound every async iteration, 1.03x sync)."""
        import ray

        if self.in_flight and self.serving:
            ended, _ = ray.wait(self.serving, num_returns=len(self.serving), timeout=0)
            if not ended:       # a serve call that ended (an error) is next_batch's to raise, not this
                self.collect(0.0, raise_errors=False)
        return bool(self.in_flight)

    def save(self, directory: Path) -> None:
        """The buffered groups and the ids of those in flight (a resumed run plays them again; a stream
        does not wait for the next iteration's groups: which groups finish first depends on timing)."""
        self.collect(0.0, raise_errors=False)
        directory.mkdir(parents=True, exist_ok=True)
        self.buffer.save(directory)
        (directory / STATE_FILE).write_text(json.dumps({
            "next_group": self.next_group, "in_flight": sorted(self.in_flight), "stats": self.buffer.stats,
            "dropped_total": self.buffer.dropped_total, "filtered_total": self.filtered_total}))

    def stop(self) -> list[GroupSpec]:
        """Every worker finishes the groups it started; the others come back (not started)."""
        import ray

        self.workers.stop_serving(self.session)
        unstarted = [spec for specs in ray.get(self.serving) for spec in specs]
        # what the workers finished before they stopped: the take calls in flight, then one last take each
        pending = list(self.takes.values()) + [self.workers.take_groups(w, 0.0, self.session)
                                              for w in range(self.workers.num_workers)]
        for results in ray.get(pending):
            for result in results:
                self.arrive(result)
        self.takes, self.serving = {}, []
        for spec in unstarted:
            self.in_flight.pop(spec.group_id, None)
        return unstarted

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        unstarted = self.stop()
        try:
            yield
        finally:
            self.serve()
            self.give(unstarted)
            self.admit()

    def close(self) -> None:
        import ray

        if not self.serving:
            return
        self.workers.stop_serving(self.session)
        for ref in self.serving + list(self.takes.values()):
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001 - a finished call cannot be cancelled
                pass
        self.serving, self.takes = [], {}


__all__ = ["StreamingRollout", "signal_free"]
