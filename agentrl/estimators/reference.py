"""The estimators' specification: per-record Python, written to be read.

Each built-in estimator has a straightforward implementation here, written the way the papers and
their reference code read (dicts of lists, loops over records, a backward loop per trajectory, a
distance per centroid), in float64 throughout. The vectorised estimators
(:mod:`agentrl.estimators.builtin`) must give the same advantages to 1e-6 (``tests/estimators``
check it on hand-made and random batches, and ``agentrl bench estimators`` times both). They take
the same ``Params`` objects, so both sides always mean the same configuration; :data:`REFERENCES`
maps each estimator name to its function.

Rewards come from the StepBatch's columns: the step reward is ``env_reward - noop_penalty`` and
the invalid-action penalty ``invalid_penalty`` enters per ``penalty_mode`` (nothing is added back).
"""

from __future__ import annotations

import difflib
import math
from collections import defaultdict

import torch

from agentrl.data import StepBatch
from agentrl.estimators.registry import build_params, estimator_class

# ----- helpers ----------------------------------------------------------------------------------------
def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _trajectories(batch: StepBatch) -> dict[int, list[int]]:
    """Row indices of every trajectory, ordered by step."""
    traj = defaultdict(list)
    for i, t in enumerate(batch.traj_id.tolist()):
        traj[t].append(i)
    steps = batch.step.tolist()
    return {t: sorted(rows, key=lambda i: steps[i]) for t, rows in traj.items()}


def reference_returns(batch: StepBatch, gamma: float, penalty_mode: str):
    """(episode score, trajectory return, step return, row penalty) per row, as Python lists.

    ``after_discount``: rewards without the invalid-action penalty are summed and discounted, and
    the penalty is then charged to its own row's score and step return. ``in_reward``: the
    penalty is one more reward of its row (and no row is charged separately).
    """
    n = len(batch)
    env_reward = [float(x) for x in batch.env_reward.tolist()]
    noop = [float(x) for x in batch.noop_penalty.tolist()]
    invalid = [float(x) for x in batch.invalid_penalty.tolist()]
    score, traj_return, step_return, row_penalty = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    for rows in _trajectories(batch).values():
        if penalty_mode == "after_discount":
            reward = {i: env_reward[i] - noop[i] for i in rows}
            charged = {i: invalid[i] for i in rows}
        else:
            reward = {i: env_reward[i] - noop[i] - invalid[i] for i in rows}
            charged = {i: 0.0 for i in rows}
        total = sum(reward[i] for i in rows)
        running = 0.0
        for i in reversed(rows):
            running = reward[i] + gamma * running
            step_return[i] = running - charged[i]
        for i in rows:
            traj_return[i] = total
            score[i] = total - charged[i]
            row_penalty[i] = charged[i]
    return score, traj_return, step_return, row_penalty


def _groups(keys: list) -> dict:
    out = defaultdict(list)
    for i, k in enumerate(keys):
        out[k].append(i)
    return out


def reference_episode(batch: StepBatch, score, traj_return, row_penalty, by_std: bool, eps: float,
                      stats: str) -> list[float]:
    """The episode term: ``steps`` normalises the rows' scores; ``trajectories`` normalises the
    trajectory returns over one per trajectory and then charges the row's own penalty."""
    groups = batch.group_id.tolist()
    out = [0.0] * len(batch)
    for rows in _groups(groups).values():
        if stats == "steps":
            values = [score[i] for i in rows]
        else:
            seen, values = set(), []
            for i in rows:
                t = int(batch.traj_id[i])
                if t not in seen:
                    seen.add(t)
                    values.append(traj_return[i])
        mean, std = (0.0, 1.0) if len(values) == 1 else (_mean(values), _std(values))
        for i in rows:
            if stats == "steps":
                out[i] = (score[i] - mean) / (std + eps) if by_std else score[i] - mean
            else:
                out[i] = ((traj_return[i] - mean) / (std + eps) if by_std else traj_return[i] - mean) - row_penalty[i]
    return out


def _normalise_step(values: list[float], members: dict, by_std: bool, eps: float) -> list[float]:
    out = [0.0] * len(values)
    for rows in members.values():
        xs = [values[i] for i in rows]
        mean, std = (xs[0], 1.0) if len(xs) == 1 else (_mean(xs), _std(xs))
        for i in rows:
            out[i] = (values[i] - mean) / (std + eps) if by_std else values[i] - mean
    return out


# ----- estimators -------------------------------------------------------------------------------------
def reference_grpo(batch: StepBatch, p) -> list[float]:
    score, traj_return, _, charged = reference_returns(batch, 1.0, p.penalty_mode)
    return reference_episode(batch, score, traj_return, charged, p.norm_by_std, p.epsilon, p.episode_stats)


def reference_rloo(batch: StepBatch, p) -> list[float]:
    score, traj_return, _, _ = reference_returns(batch, 1.0, p.penalty_mode)
    out = [0.0] * len(batch)
    for rows in _groups(batch.group_id.tolist()).values():
        if p.episode_stats == "steps":
            members = {i: score[i] for i in rows}
            own = {i: i for i in rows}
        else:
            members = {int(batch.traj_id[i]): traj_return[i] for i in rows}
            own = {i: int(batch.traj_id[i]) for i in rows}
        for i in rows:
            if len(members) == 1:
                out[i] = score[i]
            else:
                others = [v for k, v in members.items() if k != own[i]]
                out[i] = score[i] - _mean(others)
    return out


def reference_anchor_groups(batch: StepBatch, similarity: bool, thresh: float) -> dict:
    members = defaultdict(list)
    groups = batch.group_id.tolist()
    reps: dict[int, list[tuple[int, str]]] = defaultdict(list)
    next_id = 0
    for i, obs in enumerate(batch.anchor_obs):
        if not similarity:
            members[(groups[i], obs)].append(i)
            continue
        chosen = None
        for cid, rep in reps[groups[i]]:
            if difflib.SequenceMatcher(None, obs, rep).ratio() >= thresh:
                chosen = cid
                break
        if chosen is None:
            chosen, next_id = next_id, next_id + 1
            reps[groups[i]].append((chosen, obs))
        members[chosen].append(i)
    return members


def reference_gigpo(batch: StepBatch, p) -> list[float]:
    by_std = p.mode == "mean_std_norm"
    score, traj_return, step_return, charged = reference_returns(batch, p.gamma, p.penalty_mode)
    episode = reference_episode(batch, score, traj_return, charged, by_std, p.epsilon, p.episode_stats)
    anchors = reference_anchor_groups(batch, p.enable_similarity, p.similarity_thresh)
    step = _normalise_step(step_return, anchors, by_std, p.epsilon)
    return [e + p.step_advantage_w * s for e, s in zip(episode, step)]


def reference_gagpo(batch: StepBatch, p) -> list[float]:
    _, _, step_return, _ = reference_returns(batch, p.gamma, p.penalty_mode)
    value = [0.0] * len(batch)
    for rows in reference_anchor_groups(batch, False, 1.0).values():
        v = _mean([step_return[i] for i in rows])
        for i in rows:
            value[i] = v
    raw = [0.0] * len(batch)
    for rows in _trajectories(batch).values():
        running = 0.0
        for k in reversed(range(len(rows))):
            i = rows[k]
            next_return = step_return[rows[k + 1]] if k + 1 < len(rows) else 0.0
            next_value = value[rows[k + 1]] if k + 1 < len(rows) else 0.0
            delta = (step_return[i] - p.gamma * next_return) + p.gamma * next_value - value[i]
            running = delta + p.gamma * p.lam * running
            raw[i] = running
    out = [0.0] * len(batch)
    by_std = p.mode == "mean_std_norm"
    for rows in _groups(batch.group_id.tolist()).values():
        xs = [raw[i] for i in rows]
        mean, std = (0.0, 1.0) if len(xs) == 1 else (_mean(xs), _std(xs))
        for i in rows:
            out[i] = (raw[i] - mean) / (std + p.epsilon) if by_std else raw[i] - mean
    return out


def reference_clusters(batch: StepBatch, eps: float, centroid: str) -> list[int]:
    """Greedy pass, one record at a time, one cosine per existing centroid."""
    threshold = 1.0 - eps - 1e-6
    x = batch.hidden.to(torch.float32)
    norm = torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12)
    unit = torch.nn.functional.normalize(x, dim=1)
    label = [0] * len(batch)
    clusters: dict[int, list[list]] = defaultdict(list)  # group -> [[id, centroid, member sum]]
    next_id = 0
    for i, g in enumerate(batch.group_id.tolist()):
        best, best_sim = None, -float("inf")
        for entry in clusters[g]:
            sim = float(torch.dot(entry[1], unit[i])) if centroid == "mean" else \
                float(torch.dot(x[entry[3]], x[i]) / (norm[entry[3]] * norm[i]))
            if sim > best_sim:
                best, best_sim = entry, sim
        if best is not None and best_sim >= threshold:
            label[i] = best[0]
            if centroid == "mean":
                best[2] = best[2] + unit[i]
                best[1] = best[2] / best[2].norm().clamp_min(1e-12)
        else:
            clusters[g].append([next_id, unit[i].clone(), unit[i].clone(), i])
            label[i] = next_id
            next_id += 1
    return label


def reference_bipace(batch: StepBatch, p, eps: float | None = None) -> list[float]:
    by_std = p.mode == "mean_std_norm"
    score, traj_return, step_return, charged = reference_returns(batch, p.gamma, p.penalty_mode)
    episode = reference_episode(batch, score, traj_return, charged, by_std, p.epsilon, p.episode_stats)
    labels = reference_clusters(batch, p.eps if eps is None else eps, p.centroid)
    if p.pace == "first_token":
        ids, mask = batch.response_ids.tolist(), batch.response_mask.tolist()
        keys = [tuple(t if m > 0 else -1 for t, m in zip(ids[i][: p.first_token_len], mask[i][: p.first_token_len]))
                + (-1,) * max(0, p.first_token_len - len(ids[i])) for i in range(len(batch))]
    else:
        keys = list(batch.action)
    members = _groups(labels)
    if p.pace == "state_only":
        step = _normalise_step(step_return, members, by_std, p.epsilon)
    else:
        step = [0.0] * len(batch)
        for rows in members.values():
            if len(rows) == 1:
                continue
            returns = [step_return[i] for i in rows]
            distinct = {keys[i] for i in rows}
            std = _std(returns)
            for i in rows:
                if len(distinct) == 1:
                    a = step_return[i] - _mean([step_return[j] for j in rows if j != i])
                elif p.pace == "q":
                    a = _mean([step_return[j] for j in rows if keys[j] == keys[i]]) - _mean(returns)
                else:
                    a = step_return[i] - _mean([step_return[j] for j in rows if keys[j] != keys[i]])
                step[i] = a / (std + p.epsilon) if p.pace_norm_by_std else a
    return [e + p.step_advantage_w * s for e, s in zip(episode, step)]


def reference_reinforce_pp(batch: StepBatch, p) -> list[float]:
    score, traj_return, _, _ = reference_returns(batch, 1.0, p.penalty_mode)
    diff = [0.0] * len(batch)
    for rows in _groups(batch.group_id.tolist()).values():
        if p.episode_stats == "steps":
            members = [score[i] for i in rows]
        else:
            members = list({int(batch.traj_id[i]): traj_return[i] for i in rows}.values())
        for i in rows:
            diff[i] = 0.0 if len(members) == 1 else score[i] - _mean(members)
    if not p.whiten or len(diff) < 2:
        return diff
    mean, std = _mean(diff), _std(diff)
    return [(d - mean) / (std + p.epsilon) for d in diff]


REFERENCES = {
    "grpo": reference_grpo, "rloo": reference_rloo, "reinforce_pp": reference_reinforce_pp,
    "gigpo": reference_gigpo, "gagpo": reference_gagpo, "bipace": reference_bipace,
}


def reference_advantages(name: str, batch: StepBatch, **params) -> torch.Tensor:
    """The reference advantages of estimator ``name`` with ``params`` (shared keys it does not read
    are ignored, as in :func:`agentrl.estimators.compute_advantages`)."""

    resolved = build_params(estimator_class(name), params)
    return torch.tensor(REFERENCES[name](batch, resolved), dtype=torch.float64)
