"""GiGPO: episode term plus a step term over anchor-state groups.

Follows the reference implementation (verl-agent ``gigpo/core_gigpo.py``) rather than the
paper's equations where the two differ:

* Episode term: the GRPO-style term of :func:`common.episode_advantage` with the same ``mode``
  as the step term. ``episode_stats="steps"`` (default) takes mean and std over all step rows
  of the group, as the reference code's ``compute_mean_std_cross_steps=True``;
  ``"trajectories"`` over one return per trajectory (the paper's Eq. 3). A group with one member
  keeps its raw score.
* Step return: ``G_t = r_t + gamma * G_{t+1}`` over the trajectory's clean env rewards. The
  invalid-action penalty ``c`` is charged after discounting (``penalty_mode="after_discount"``):
  an invalid row's step return is ``G_t - c`` and its episode score ``R(tau) - c``; earlier
  steps are not charged. ``penalty_mode="in_reward"`` keeps the penalty as an ordinary reward.
* Anchor groups: rows of one group whose ``anchor_obs`` are exactly equal (revisits inside one
  trajectory included). With ``enable_similarity`` the distinct observations of a group are
  clustered greedily in order of first appearance: each joins the first existing cluster whose
  representative (its first observation) has ``difflib.SequenceMatcher(None, obs, rep).ratio()
  >= similarity_thresh`` (the representative is the second sequence, which difflib indexes once), else starts a new cluster. Equal strings always land together, so
  clustering the distinct strings gives the same clusters as clustering every row.
* Step term: ``(G - mean_a(G)) / (std_a(G) + epsilon)`` (mean_std_norm, unbiased std) or
  ``G - mean_a(G)`` (mean_norm) within anchor group ``a``; a singleton anchor group gives 0.
* ``A = A_episode + step_advantage_w * A_step``.
"""

from __future__ import annotations

import dataclasses
import difflib

import numpy as np
import torch

from agentrl.data import StepBatch
from agentrl.estimators import common
from agentrl.estimators.registry import (EPISODE_STATS, MODES, PENALTY_MODES, check_choice, check_range,
                                         register_estimator)


@dataclasses.dataclass(frozen=True)
class GiGPOParams(common.StepEstimatorParams):
    enable_similarity: bool = dataclasses.field(default=False, metadata={
        "help": "group anchor observations by difflib similarity instead of exact equality"})
    similarity_thresh: float = dataclasses.field(default=0.95, metadata={
        "help": "SequenceMatcher ratio at or above which an observation joins a cluster (enable_similarity)"})

    def __post_init__(self) -> None:
        check_choice("gigpo", "mode", self.mode, MODES)
        check_choice("gigpo", "episode_stats", self.episode_stats, EPISODE_STATS)
        check_choice("gigpo", "penalty_mode", self.penalty_mode, PENALTY_MODES)
        check_range("gigpo", "gamma", self.gamma, 0.0, 1.0)
        check_range("gigpo", "similarity_thresh", self.similarity_thresh, 0.0, 1.0)


def similar_anchor_segments(anchor_obs: list[str], group: torch.Tensor, threshold: float) -> tuple[torch.Tensor, int]:
    """Greedy similarity clustering of the anchor observations inside each group.

    The greedy pass is sequential by nature; it runs over distinct observations (not rows) and
    prunes with difflib's cheap upper bounds before computing the exact ratio.
    """
    codes = common.string_codes(anchor_obs)
    distinct: dict[int, str] = {}
    for code, obs in zip(codes.tolist(), anchor_obs):
        distinct.setdefault(code, obs)
    pair, num_pairs = common.pair_segments(group, codes)
    # one (group, code) per pair segment, in order of first appearance in the batch
    first_row = torch.full((num_pairs,), len(anchor_obs), dtype=torch.int64).scatter_reduce_(
        0, pair, torch.arange(len(anchor_obs)), reduce="amin")
    order = torch.argsort(first_row)
    pair_group = group[first_row].tolist()
    pair_code = codes[first_row].tolist()
    cluster_of_pair = torch.empty(num_pairs, dtype=torch.int64)
    reps: dict[int, list[tuple[int, difflib.SequenceMatcher]]] = {}
    next_cluster = 0
    for p in order.tolist():
        obs = distinct[pair_code[p]]
        clusters = reps.setdefault(pair_group[p], [])
        chosen = -1
        for cluster_id, matcher in clusters:
            matcher.set_seq1(obs)
            if (matcher.real_quick_ratio() >= threshold and matcher.quick_ratio() >= threshold
                    and matcher.ratio() >= threshold):
                chosen = cluster_id
                break
        if chosen < 0:
            chosen = next_cluster
            next_cluster += 1
            matcher = difflib.SequenceMatcher(None, "", obs)
            clusters.append((chosen, matcher))
        cluster_of_pair[p] = chosen
    return cluster_of_pair[pair], next_cluster


def step_segments(batch: StepBatch, group: torch.Tensor, params: GiGPOParams) -> tuple[torch.Tensor, int]:
    if params.enable_similarity:
        return similar_anchor_segments(batch.anchor_obs, group, params.similarity_thresh)
    return common.anchor_segments(batch, group)


@register_estimator("gigpo", GiGPOParams)
def gigpo_advantages(batch: StepBatch, params: GiGPOParams, state=None) -> tuple[torch.Tensor, dict[str, float]]:
    by_std = params.mode == "mean_std_norm"
    layout = common.TrajectoryLayout.of(batch)
    returns = common.row_returns(batch, layout, params.gamma, params.invalid_action_penalty, params.penalty_mode)
    episode, group, num_groups = common.episode_advantage(batch, returns, by_std, params.epsilon, params.episode_stats)
    anchor, num_anchor = step_segments(batch, group, params)
    step = common.normalise_in_segments(returns.step_return, anchor, num_anchor, by_std, params.epsilon, "zero")
    episode, step = episode.numpy(), step.numpy()
    adv = episode + params.step_advantage_w * step
    diagnostics = {
        "num_groups": float(num_groups),
        "num_step_groups": float(num_anchor),
        "step_group_singleton_rate": common.singleton_rate(anchor, num_anchor),
        "mean_step_group_size": common.mean_segment_size(anchor, num_anchor),
        "episode_adv_mean": float(episode.mean()) if len(batch) else 0.0,
        "step_adv_abs_mean": float(np.abs(step).mean()) if len(batch) else 0.0,
    }
    return torch.from_numpy(adv.astype(np.float32)), diagnostics
