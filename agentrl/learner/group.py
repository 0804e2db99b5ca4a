"""Start the learner ranks and fan calls out to them.

``LearnerGroup(cfg, model_path)`` with ``learner.num_ranks == 1`` builds one :class:`Learner`
in this process (no Ray). With more ranks it starts one Ray actor per rank (``num_cpus=1`` each
on CPU, one GPU each on GPU; in the placement plan's bundles when ``slots`` are given), gives them ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``
and creates the DeepSpeed process group in all of them at once. The trainer calls the same
methods either way:

* ``compute_logprobs(batch)``: each rank gets a contiguous slice of the rows; the filled columns
  are put back together in the original order;
* ``update(batch)``: the batch goes once into the object store and every rank reads it; each rank
  trains on its slice of every mini-batch; metrics are already reduced over ranks;
* ``weights_call(sender, method, ...)``: a weight path's sender on every rank (:mod:`agentrl.weights`);
  ``state_dict_for_rollout()``, ``export_hf(dir)``: collective; rank 0's result is returned;
* ``save_checkpoint(dir)`` / ``load_checkpoint(dir)``: collective.

Every call to the ranks waits with a bound on a rank that never returns (``learner.collective_timeout_s``,
:mod:`agentrl.learner.rank_calls`): :class:`LearnerHangError` names it, and the group is then broken
(``shutdown`` kills the ranks without asking them to close). Given a ``shared_directory`` (the run
directory), the ranks first prove that they see the directory this process writes
(:mod:`agentrl.runs.shared_directory`), before any model is loaded.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import torch

from agentrl.config.schema import Config
from agentrl.data import StepBatch
from agentrl.estimators.base import LossOptions
from agentrl.runtime.denormals import denormals_flushed, flush_denormals
from agentrl.runtime.rendezvous import reserve_store
from agentrl.learner.engine import Learner, resolve_device
from agentrl.learner.rank_calls import LearnerHangError, RankPlace, wait_for_ranks
from agentrl.runs.shared_directory import check_shared_directory, view_of_directory
from agentrl.runtime.actor_slots import ActorSlot, actor_options, slot_at
from agentrl.runtime.ray_start import custom_resources, init_local_ray

FILLED_COLUMNS = ("old_logprobs", "ref_logprobs", "hidden")
SHUTDOWN_TIMEOUT_S = 60.0


class LearnerRank:
    """The body of one rank's Ray actor: sets the rank's environment, then holds a Learner."""

    def __init__(self, env: dict[str, str]):
        os.environ.update(env)
        flush_denormals()    # before torch starts this process's threads
        self.learner: Optional[Learner] = None

    def place(self) -> tuple[str, str, int]:
        """This rank's node address, Ray node id and process id."""
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id(), os.getpid()

    def view_of_directory(self, directory: str, nonce: str, rank: int) -> dict[str, Any]:
        return view_of_directory(directory, nonce, rank)

    def serve_store(self, world_size: int) -> tuple[str, int]:
        """This node's address and the port of a rendezvous store this rank serves, bound now."""
        import ray

        return ray.util.get_node_ip_address(), reserve_store(world_size)

    def start(self, cfg: Config, model_path: str, tokenizer_path: Optional[str], env: dict[str, str]) -> float:
        os.environ.update(env)
        self.learner = Learner(cfg, model_path, tokenizer_path)
        return self.learner.init_seconds

    def logprob_columns(self, batch: StepBatch, hidden_layer: Optional[int]) -> dict[str, torch.Tensor]:
        filled = self.learner.compute_logprobs(batch, hidden_layer)
        return {name: getattr(filled, name) for name in FILLED_COLUMNS if getattr(filled, name) is not None}

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.learner, method)(*args)

    def denormals_flushed(self) -> bool:
        return denormals_flushed()


def rank_places(places: Sequence[tuple[str, str, int]]) -> list[RankPlace]:
    """:class:`RankPlace` of each rank from its ``LearnerRank.place()``, with its node's custom resources."""
    import ray

    resources = {node["NodeID"]: tuple(custom_resources(node)) for node in ray.nodes() if node.get("Alive")}
    return [RankPlace(rank, address, resources.get(node_id, ()), pid)
            for rank, (address, node_id, pid) in enumerate(places)]


class LearnerGroup:
    """The learner ranks behind one handle: in-process for one rank, Ray actors for more."""

    def __init__(self, cfg: Config, model_path: str, tokenizer_path: Optional[str] = None,
                 slots: Optional[Sequence[ActorSlot]] = None, shared_directory: Optional[str] = None):
        self.cfg = cfg
        self.num_ranks = cfg.learner.num_ranks
        self.collective_timeout_s = cfg.learner.collective_timeout_s
        self.local: Optional[Learner] = None
        self.actors: list[Any] = []
        self.places: list[RankPlace] = []
        self.broken = False         # a rank hung: the others' process group is unusable
        if self.num_ranks == 1:
            self.local = Learner(cfg, model_path, tokenizer_path)
            self.init_seconds = self.local.init_seconds
            return
        import ray

        if not ray.is_initialized():
            init_local_ray(max(os.cpu_count() or 1, self.num_ranks))
        gpu = resolve_device(cfg.trainer.device) == "cuda"
        remote_rank = ray.remote(LearnerRank)
        base_env = {"WORLD_SIZE": str(self.num_ranks), "DS_ACCELERATOR": "cuda" if gpu else "cpu"}
        # slots: the placement plan's bundles (GPU runs); else placement.learner, a Ray custom resource
        # per rank, puts it on a chosen node
        self.actors = [remote_rank.options(**actor_options(slot_at(slots, r), num_cpus=1, num_gpus=1 if gpu else 0,
                                                           resources=cfg.placement.learner, index=r)
                                           ).remote({**base_env, "RANK": str(r)})
                       for r in range(self.num_ranks)]
        try:
            self.places = rank_places(ray.get([a.place.remote() for a in self.actors]))
            if shared_directory is not None:
                check_shared_directory(shared_directory, self.places, lambda directory, nonce: ray.get(
                    [a.view_of_directory.remote(directory, nonce, r) for r, a in enumerate(self.actors)]))
            address, port = ray.get(self.actors[0].serve_store.remote(self.num_ranks))
            envs = [{**base_env, "RANK": str(r), "MASTER_ADDR": address, "MASTER_PORT": str(port),
                     # each actor sees only its own GPU (Ray sets CUDA_VISIBLE_DEVICES), so it is device 0
                     "LOCAL_RANK": "0" if gpu else str(r)} for r in range(self.num_ranks)]
            seconds = self._wait([a.start.remote(cfg, model_path, tokenizer_path, env)
                                  for a, env in zip(self.actors, envs)], "start")
        except BaseException:
            self.broken = True      # nothing to close on ranks that did not start: kill them
            self.shutdown()
            raise
        self.init_seconds = max(seconds)

    def _wait(self, refs: list[Any], method: str) -> list[Any]:
        """Every rank's result of ``method`` (``refs`` in rank order), a rank that never returns reported."""
        try:
            return wait_for_ranks(refs, self.places, method, self.collective_timeout_s)
        except LearnerHangError:
            self.broken = True
            raise

    def _all(self, method: str, *args: Any) -> list[Any]:
        return self._wait([a.call.remote(method, *args) for a in self.actors], method)

    def compute_logprobs(self, batch: StepBatch, hidden_layer: Optional[int] = None) -> StepBatch:
        """``old_logprobs``, ``ref_logprobs`` and (with ``hidden_layer``) ``hidden`` of every row."""
        if self.local is not None:
            return self.local.compute_logprobs(batch, hidden_layer)
        shards = torch.tensor_split(torch.arange(len(batch)), self.num_ranks)
        parts = self._wait([a.logprob_columns.remote(batch.select(rows), hidden_layer)
                            for a, rows in zip(self.actors, shards)], "compute_logprobs")
        columns = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
        return batch.with_columns(**columns)

    def update(self, batch: StepBatch, options: Optional[LossOptions] = None, version: Optional[int] = None
               ) -> dict[str, float]:
        """The PPO epochs over ``batch`` with the estimator's loss options; metrics of rank 0
        (``version``: the learner's policy version, for the metrics per staleness level)."""
        if self.local is not None:
            return self.local.update(batch, options, version)
        import ray

        return self._all("update", ray.put(batch), options, version)[0]

    def set_thread_policy(self, policy) -> None:
        """A one-rank learner in this process asks ``policy()`` for its CPU threads before each
        micro-batch (None: it keeps the threads it has); see :mod:`agentrl.training.cpu_cores`."""
        if self.local is not None:
            self.local.threads_now = policy

    def state_dict_for_rollout(self) -> dict[str, torch.Tensor]:
        if self.local is not None:
            return self.local.state_dict_for_rollout()
        return self._all("state_dict_for_rollout")[0]

    def gpu_uuids(self) -> list[str]:
        """Each rank's GPU, in rank order (empty on CPU)."""
        uuids = [self.local.gpu_uuid()] if self.local is not None else self._all("gpu_uuid")
        return [u for u in uuids if u is not None]

    def free_cached_memory(self) -> None:
        """Every rank hands its cached CUDA memory back (before the engines on its GPUs wake)."""
        if self.local is not None:
            self.local.free_cached_memory()
        else:
            self._all("free_cached_memory")

    def weights_call(self, sender: type, method: str, *args: Any) -> list[Any]:
        """``method`` of a weight path's sender on every rank (:meth:`Learner.weights_call`); the results
        in rank order (rank 0's first)."""
        if self.local is not None:
            return [self.local.weights_call(sender, method, *args)]
        return self._all("weights_call", sender, method, *args)

    def save_checkpoint(self, directory: str) -> None:
        if self.local is not None:
            self.local.save_checkpoint(directory)
        else:
            self._all("save_checkpoint", directory)

    def load_checkpoint(self, directory: str) -> None:
        if self.local is not None:
            self.local.load_checkpoint(directory)
        else:
            self._all("load_checkpoint", directory)

    def export_hf(self, directory: str) -> None:
        if self.local is not None:
            self.local.export_hf(directory)
        else:
            self._all("export_hf", directory)

    def shutdown(self) -> None:
        """Close every rank's process group, then stop the rank actors. Runs after failures too, so
        a rank that cannot be reached any more is only killed; after a hang (``broken``) every rank
        is only killed: a hung rank never takes the close call, and its peers' group is unusable."""
        if self.local is not None:
            self.local.close()
            self.local = None
            return
        import ray

        if not self.broken:
            try:
                ray.get([a.call.remote("close") for a in self.actors], timeout=SHUTDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a dead or hung rank must not hide the error that stopped the run
                pass
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
