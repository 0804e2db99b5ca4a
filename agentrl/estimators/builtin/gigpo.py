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
import rapidfuzz.process
import torch
from rapidfuzz.distance import Indel

from agentrl.data import StepBatch
from agentrl.estimators import common
from agentrl.estimators.base import Estimator
from agentrl.estimators.params import param, shared
from agentrl.estimators.registry import register_estimator


BOUND_SLACK = 1e-9      # the Indel bound and difflib's ratio round differently at equality


def similar_anchor_segments(anchor_obs: list[str], group: torch.Tensor, threshold: float) -> tuple[torch.Tensor, int]:
    """Greedy similarity clustering of the anchor observations inside each group.

    The greedy pass is sequential by nature; it runs over distinct observations (not rows). The
    distinct observations of each group are first scored against each other in one call with
    rapidfuzz's Indel similarity, ``2 LCS / (len(a) + len(b))``: difflib's matching blocks form a
    common subsequence, so its ratio never exceeds that, and a representative scoring below the
    threshold cannot pass. difflib's exact ratio then runs, in order, on the few representatives
    that remain, so the clusters are the reference code's.
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
    # per group: its distinct observations in order of first appearance, and all their bounds at once
    members: dict[int, list[int]] = {}
    for p in order.tolist():
        members.setdefault(pair_group[p], []).append(p)
    # no score_cutoff: rapidfuzz turns it into a distance cutoff that drops scores equal to the
    # threshold, which difflib's ``>=`` accepts
    bounds = {g: rapidfuzz.process.cdist(texts, texts, scorer=Indel.normalized_similarity, dtype=np.float64,
                                         workers=max(torch.get_num_threads(), 1))
              for g, texts in ((g, [distinct[pair_code[p]] for p in ps]) for g, ps in members.items())}
    # within each group, in order: an observation with no earlier one inside the bound starts a
    # cluster outright; the others try their bound-passing earlier representatives with difflib
    # (matchers built on first use: indexing a representative costs more than its bound)
    rep_pairs = []
    rep_of_pair: dict[int, int] = {}
    for g, ps in members.items():
        candidate = np.tril(bounds[g] >= threshold - BOUND_SLACK, -1)
        rep_of = np.arange(len(ps))
        is_rep = np.ones(len(ps), dtype=bool)
        matchers: dict[int, difflib.SequenceMatcher] = {}
        for i in np.flatnonzero(candidate.any(axis=1)).tolist():
            obs = distinct[pair_code[ps[i]]]
            for j in np.flatnonzero(candidate[i] & is_rep).tolist():
                matcher = matchers.get(j)
                if matcher is None:
                    matcher = matchers[j] = difflib.SequenceMatcher(None, "", distinct[pair_code[ps[j]]])
                matcher.set_seq1(obs)
                if matcher.ratio() >= threshold:
                    rep_of[i], is_rep[i] = j, False
                    break
        rep_pairs.extend(ps[j] for j in np.flatnonzero(is_rep).tolist())
        rep_of_pair.update((p, ps[j]) for p, j in zip(ps, rep_of.tolist()))
    # clusters numbered in order of their representative's first appearance in the batch
    rank = {p: i for i, p in enumerate(order.tolist())}
    cluster_id = {p: c for c, p in enumerate(sorted(rep_pairs, key=rank.__getitem__))}
    for p, rep in rep_of_pair.items():
        cluster_of_pair[p] = cluster_id[rep]
    next_cluster = len(cluster_id)
    return cluster_of_pair[pair], next_cluster


@register_estimator
class GiGPO(Estimator):
    name = "gigpo"
    title = "GiGPO"
    table_rank = 30

    @dataclasses.dataclass(frozen=True)
    class Params:
        gamma: float = shared("gamma")
        step_advantage_w: float = shared("step_advantage_w")
        mode: str = shared("mode")
        epsilon: float = shared("epsilon")
        episode_stats: str = shared("episode_stats")
        penalty_mode: str = shared("penalty_mode")
        enable_similarity: bool = param(False, "group anchor observations by difflib similarity instead of exact "
                                        "equality")
        similarity_thresh: float = param(0.95, "SequenceMatcher ratio at or above which an observation joins a "
                                         "cluster (enable_similarity)", min=0, max=1)

    def step_segments(self, batch: StepBatch, group: torch.Tensor) -> tuple[torch.Tensor, int]:
        if self.params.enable_similarity:
            return similar_anchor_segments(batch.anchor_obs, group, self.params.similarity_thresh)
        return common.anchor_segments(batch, group)

    def step_groups(self, batch: StepBatch, state=None) -> torch.Tensor:
        return self.step_segments(batch, common.group_segments(batch)[0])[0]

    def advantages(self, batch: StepBatch, state=None) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        by_std = p.mode == "mean_std_norm"
        layout = common.TrajectoryLayout.of(batch)
        returns = common.row_returns(batch, layout, p.gamma, p.penalty_mode)
        episode, group, num_groups = common.episode_advantage(batch, returns, by_std, p.epsilon, p.episode_stats)
        anchor, num_anchor = self.step_segments(batch, group)
        step = common.normalise_in_segments(returns.step_return, anchor, num_anchor, by_std, p.epsilon, "zero")
        episode, step = episode.numpy(), step.numpy()
        adv = episode + p.step_advantage_w * step
        diagnostics = {
            "num_groups": float(num_groups),
            "num_step_groups": float(num_anchor),
            "step_group_singleton_rate": common.singleton_rate(anchor, num_anchor),
            "mean_step_group_size": common.mean_segment_size(anchor, num_anchor),
            "episode_adv_mean": float(episode.mean()) if len(batch) else 0.0,
            "step_adv_abs_mean": float(np.abs(step).mean()) if len(batch) else 0.0,
        }
        return torch.from_numpy(adv.astype(np.float32)), diagnostics
