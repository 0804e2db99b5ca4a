"""BiPACE: BiGPO state clusters from actor hidden states, PACE action-conditioned step baselines.

    A = A_episode + step_advantage_w * A_step

* ``A_episode``: GiGPO's episode term (same ``mode``, ``episode_stats`` and penalty handling).
* Step returns ``R``: GiGPO's step returns ``G'_t`` (discount ``gamma``, penalty per ``penalty_mode``).
* Clusters: :mod:`~agentrl.estimators.builtin.bipace.clustering` over ``batch.hidden`` within
  each group, radius ``eps`` (``eps_mode="fixed"``) or a radius calibrated on the first batch and
  frozen in a :class:`BiGPOState` the caller keeps (``eps_mode="calibrate"``).
* ``A_step`` inside a cluster C with key k(i) of row i (``C=`` same key as i, i included;
  ``C!=`` different key):

  =============  =====================================================================
  pace           A_step(i)
  =============  =====================================================================
  q (default)    mean(R over C=) - mean(R over C)           key: action tag
  first_token    R_i - mean(R over C!=)                      key: first response tokens
  action_tag     R_i - mean(R over C!=)                      key: action tag
  state_only     GiGPO's step term over the clusters, normalised with ``mode``
  =============  =====================================================================

  A singleton cluster gives 0. A cluster with one distinct key gives the leave-one-out
  fallback ``R_i - mean(R over C minus i)`` (for q this is the case where Q = V; for the
  diff-peer variants it is the case where i has no different-key peer, the same condition).

Choices where the sources are silent, each with its reason:

* Fallback trigger for q: "the cluster has one distinct key", because only then is Q = V and
  the Q-style advantage identically 0; the paper's 17.9 % fallback rows under Q-style need a
  trigger of this kind.
* No std division of the q / diff-peer step terms by default (the authors' formula shows none);
  ``pace_norm_by_std=True`` divides them by the cluster's unbiased std + epsilon.
  ``state_only`` uses ``mode`` like GiGPO, so eps = 0 with an identity embedding reproduces
  GiGPO's step term exactly in both modes.
* Action-tag key: the parsed action text (``batch.action``); all invalid rows share the key "".
* First-token key: the first ``first_token_len`` response tokens (positions where
  ``response_mask`` is 0 count as absent), compared exactly rather than hashed.
* Calibration: the smallest eps of ``calibration_grid`` whose clustering of the first batch
  leaves at most ``calibration_singleton_rate`` of the rows as singletons (default 0.2, near the
  14-18 % the authors report at their chosen radii); the radius is then frozen in the state.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from agentrl.data import StepBatch
from agentrl.estimators import common
from agentrl.estimators.base import Estimator, RowInputs
from agentrl.estimators.builtin.bipace.clustering import CENTROIDS, BiGPOState, calibrate_eps, greedy_cosine_clusters
from agentrl.estimators.params import param, shared
from agentrl.estimators.registry import register_estimator

PACE_VARIANTS = ("q", "first_token", "action_tag", "state_only")
EPS_MODES = ("fixed", "calibrate")
DEFAULT_CALIBRATION_GRID = (0.01, 0.02, 0.03, 0.05, 0.075, 0.10, 0.125, 0.15, 0.20, 0.25, 0.30)


@dataclasses.dataclass(frozen=True)
class BiPACEParams:
    gamma: float = shared("gamma")
    step_advantage_w: float = shared("step_advantage_w")
    mode: str = shared("mode")
    epsilon: float = shared("epsilon")
    episode_stats: str = shared("episode_stats")
    penalty_mode: str = shared("penalty_mode")
    hidden_layer: int = param(-8, "entry of the actor's hidden_states whose last-prompt-token state clusters the "
                              "steps (0 = embeddings, negative = from the top)")
    eps: float = param(0.10, "cosine-distance radius of a BiGPO cluster", min=0, max=2)
    eps_mode: str = param("fixed", "fixed: use eps; calibrate: choose eps on the first batch, then keep it",
                          choices=EPS_MODES)
    pace: str = param("q", "action-conditioned step baseline inside a cluster", choices=PACE_VARIANTS)
    first_token_len: int = param(8, "response tokens that key an action for pace=first_token", min=1)
    centroid: str = param("seed", "cluster centroid: its first member (exactly vectorisable) or the running mean",
                          choices=CENTROIDS)
    pace_norm_by_std: bool = param(False, "divide the q / diff-peer step terms by the cluster std + epsilon")
    calibration_singleton_rate: float = param(0.2, "eps_mode=calibrate picks the smallest eps leaving at most this "
                                              "share of rows alone in their cluster", min=0, max=1)
    calibration_grid: tuple = param(DEFAULT_CALIBRATION_GRID, "eps_mode=calibrate: the eps values tried, smallest "
                                    "first")

    def __post_init__(self) -> None:
        object.__setattr__(self, "calibration_grid", tuple(float(e) for e in self.calibration_grid))
        if not self.calibration_grid:
            raise ValueError("bipace.calibration_grid must list at least one eps")


def row_codes(table: np.ndarray) -> np.ndarray:
    """Integer code per row of an integer matrix (equal rows get equal codes), one column at a time:
    a few 1-d ``np.unique`` calls instead of a sort of whole rows."""
    code = np.zeros(table.shape[0], dtype=np.int64)
    for column in table.T:
        values, column_code = np.unique(column, return_inverse=True)
        code = np.unique(code * values.size + column_code.reshape(-1), return_inverse=True)[1].reshape(-1)
    return code


def action_keys(batch: StepBatch, pace: str, first_token_len: int) -> torch.Tensor:
    """Integer action key per row (equal keys mean the same action)."""
    if pace == "first_token":
        width = min(int(first_token_len), batch.response_ids.shape[1])
        ids = batch.response_ids[:, :width].numpy().astype(np.int64)
        ids[batch.response_mask[:, :width].numpy() <= 0] = -1
        # positions past the response width are absent (-1) in every row: they cannot split keys
        return torch.from_numpy(row_codes(ids))
    return common.string_codes(batch.action)


def pace_step_advantage(step_return: torch.Tensor, cluster: torch.Tensor, num_clusters: int, key: torch.Tensor,
                        params: BiPACEParams) -> tuple[torch.Tensor, dict[str, float]]:
    """Step term per row and cluster diagnostics (rows are grouped by ``cluster``); numpy inside."""
    n = step_return.numel()
    ret, clu = step_return.to(common.F64).numpy(), cluster.numpy()
    size = np.bincount(clu, minlength=num_clusters).astype(np.float64)
    total = np.bincount(clu, ret, minlength=num_clusters)
    cell_t, num_cells = common.pair_segments(cluster, key)
    cell = cell_t.numpy()
    cell_size = np.bincount(cell, minlength=num_cells).astype(np.float64)
    cell_total = np.bincount(cell, ret, minlength=num_cells)
    cell_cluster = np.zeros(num_cells, dtype=np.int64)
    cell_cluster[cell] = clu
    distinct = np.bincount(cell_cluster, minlength=num_clusters).astype(np.float64)

    row_size, row_total, row_distinct = size[clu], total[clu], distinct[clu]
    multi = row_size > 1
    fallback = multi & (row_distinct == 1)
    paced = multi & (row_distinct > 1)
    if params.pace == "state_only":
        step = common.normalise_in_segments(step_return, cluster, num_clusters, params.mode == "mean_std_norm",
                                            params.epsilon, "zero").numpy()
    else:
        own_cell_size, own_cell_total = cell_size[cell], cell_total[cell]
        if params.pace == "q":
            paced_value = own_cell_total / own_cell_size - row_total / row_size
        else:
            paced_value = ret - (row_total - own_cell_total) / np.maximum(row_size - own_cell_size, 1)
        leave_one_out = ret - (row_total - ret) / np.maximum(row_size - 1, 1)
        step = np.where(paced, paced_value, np.where(fallback, leave_one_out, 0.0))
        if params.pace_norm_by_std:
            _, std, _ = common.segment_mean_std(step_return, cluster, num_clusters)
            step = np.where(multi, step / (std.numpy()[clu] + params.epsilon), step)
    multi_clusters = size > 1
    any_multi = bool(multi_clusters.any())
    diagnostics = {
        "num_clusters": float(num_clusters),
        "singleton_rate": float((~multi).mean()) if n else 0.0,
        "mean_cluster_size": common.mean_segment_size(cluster, num_clusters),
        "mean_multi_cluster_size": float(size[multi_clusters].mean()) if any_multi else 0.0,
        "distinct_keys_per_cluster": float(distinct[multi_clusters].mean()) if any_multi else 0.0,
        "fallback_rate": float(fallback.mean()) if n else 0.0,
        "pace_rate": float(paced.mean()) if n else 0.0,
    }
    return torch.from_numpy(step), diagnostics


def resolve_eps(batch: StepBatch, group: torch.Tensor, num_groups: int, params: BiPACEParams,
                state: BiGPOState | None) -> float:
    if params.eps_mode == "fixed":
        return float(params.eps)
    if state is None:
        raise ValueError("bipace with eps_mode='calibrate' needs a state object kept across batches: "
                         "estimator.advantages(batch, state=estimator.new_state())")
    if not state.calibrated:
        state.eps, state.calibration = calibrate_eps(batch.hidden, group, num_groups, params.calibration_grid,
                                                     params.calibration_singleton_rate, params.centroid)
    return float(state.eps)


@register_estimator
class BiPACE(Estimator):
    name = "bipace"
    title = "BiPACE"
    table_rank = 50
    Params = BiPACEParams
    State = BiGPOState

    def row_inputs(self) -> RowInputs:
        return RowInputs(hidden_layer=int(self.params.hidden_layer))

    def step_groups(self, batch: StepBatch, state: BiGPOState | None = None) -> torch.Tensor:
        """The BiGPO clusters (at the calibrated radius when ``state`` holds one)."""
        group, num_groups = common.group_segments(batch)
        eps = resolve_eps(batch, group, num_groups, self.params, state)
        return greedy_cosine_clusters(batch.hidden, group, num_groups, eps, self.params.centroid)[0]

    def advantages(self, batch: StepBatch, state: BiGPOState | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        if batch.hidden is None:
            raise ValueError("bipace needs batch.hidden (the actor's hidden state per step record): the rollout "
                             "backend records it, or the learner's log-prob pass computes it (RowInputs.hidden_layer)")
        p = self.params
        by_std = p.mode == "mean_std_norm"
        layout = common.TrajectoryLayout.of(batch)
        returns = common.row_returns(batch, layout, p.gamma, p.penalty_mode)
        episode, group, num_groups = common.episode_advantage(batch, returns, by_std, p.epsilon, p.episode_stats)
        eps = resolve_eps(batch, group, num_groups, p, state)
        cluster, num_clusters = greedy_cosine_clusters(batch.hidden, group, num_groups, eps, p.centroid)
        key = action_keys(batch, p.pace, p.first_token_len)
        step, diagnostics = pace_step_advantage(returns.step_return, cluster, num_clusters, key, p)
        adv = episode + p.step_advantage_w * step
        anchor, num_anchor = common.anchor_segments(batch, group)
        diagnostics.update({
            "eps": eps,
            "obs_hash_singleton_rate": common.singleton_rate(anchor, num_anchor),
            "obs_hash_mean_group_size": common.mean_segment_size(anchor, num_anchor),
        })
        return adv.to(torch.float32), diagnostics
