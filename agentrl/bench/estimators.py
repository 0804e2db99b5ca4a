"""``agentrl bench estimators``: time every advantage estimator on an ALFWorld-sized batch.

Workload (defaults): 16 groups x 8 trajectories x 50 steps = 6,400 step records, hidden size
3,584 (Qwen2.5-7B). Each group walks a small state graph of its own (a shared first
observation, 39 states on a ring with jumps, so revisits and loops). About 28 % of the steps
instead see a novel observation (an opened receptacle, a changed inventory) that no other record
of the group shares, which puts the observation-hash singleton rate at about 29 %, inside the
27-34 % the BiPACE paper reports for ALFWorld (the earlier version of this workload had 0.05 %).

Hidden states are unit-scale vectors: a state's vector is a room component plus its own
direction (distinct states are 70-80 degrees apart); every record adds its own noise (history
and phrasing) of random size, so most revisits fall inside the eps = 0.10 radius and some do
not. Half of the novel observations are near duplicates of the state the walk is in (cosine
distance ~0.02 before noise), the other half point somewhere new in the same room. BiGPO at
eps = 0.10 then leaves about 20 % singletons (paper: 14-18 %) in about 120 clusters per group.
About 10 % of the actions are invalid (invalid_penalty 0.1) and about a third of the trajectories win
(reward 10 at their last step). ``workload_stats`` reports the rates; the bench prints them.

Every estimator is timed (median of ``--repeats`` runs) against the per-record Python reference
of :mod:`agentrl.estimators.reference` (median of up to ``--repeats`` runs, stopping once
2 s are spent, so the slow references run once), and the two outputs must agree to 1e-6
(absolute plus relative).

The batch carries ``anchor_key``, the per-group observation numbers the rollout engine fills in
for every step (so the estimators' exact state grouping reads integers); ``gigpo_no_anchor_key``
times GiGPO on the same batch without them, grouping the 6,400 strings itself. The references
always group the strings.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from agentrl.bench._common import cpu_name
from agentrl.data import StepBatch
from agentrl.estimators import common, compute_advantages
from agentrl.estimators.builtin.bipace.clustering import greedy_cosine_clusters
from agentrl.estimators.builtin.bipace.kernel import describe_path
from agentrl.estimators.reference import reference_advantages

HELP = "time the advantage estimators (6,400 step records, hidden 3,584) against per-record references"

# (label, estimator name, params); the batch carries the rollout engine's anchor keys
# (StepBatch.anchor_key) except in the cases of WITHOUT_ANCHOR_KEYS, which group the strings
CASES = (
    ("grpo", "grpo", {}),
    ("rloo", "rloo", {}),
    ("reinforce_pp", "reinforce_pp", {}),
    ("gigpo", "gigpo", {}),
    ("gigpo_no_anchor_key", "gigpo", {}),
    ("gigpo_similarity", "gigpo", {"enable_similarity": True, "similarity_thresh": 0.95}),
    ("gagpo", "gagpo", {}),
    ("bipace_q", "bipace", {"pace": "q"}),
    ("bipace_first_token", "bipace", {"pace": "first_token"}),
    ("bipace_q_mean_centroid", "bipace", {"pace": "q", "centroid": "mean"}),
)

WITHOUT_ANCHOR_KEYS = ("gigpo_no_anchor_key",)
REFERENCE_BUDGET_MS = 2000.0   # a reference repeats (up to --repeats times) until this much time is spent

ROOMS = ("countertop", "cabinet", "drawer", "fridge", "sinkbasin", "shelf", "microwave", "stoveburner")
OBJECTS = ("mug", "apple", "knife", "plate", "bowl", "spoon", "cup", "egg", "bread", "lettuce")


def _observation(state: int, rng: torch.Generator) -> str:
    room = ROOMS[state % len(ROOMS)]
    picks = torch.randint(0, len(OBJECTS), (3,), generator=rng).tolist()
    things = ", ".join(f"a {OBJECTS[p]} {1 + (p + state) % 3}" for p in picks)
    return f"You arrive at {room} {1 + state // len(ROOMS)}. On the {room} {1 + state // len(ROOMS)}, you see {things}."


def _novel_observation(state: int, traj: int, step: int) -> str:
    room = ROOMS[state % len(ROOMS)]
    thing = OBJECTS[(traj + step) % len(OBJECTS)]
    return (f"You open the {room} {1 + state // len(ROOMS)}. In it, you see a {thing} {1 + traj}. "
            f"You are carrying: a {OBJECTS[step % len(OBJECTS)]} {1 + step}.")


def make_workload(num_trajectories: int = 128, num_groups: int = 16, steps: int = 50, hidden_size: int = 3584,
                  states_per_group: int = 40, novel_rate: float = 0.28, near_duplicate_rate: float = 0.5,
                  seed: int = 0) -> StepBatch:
    """A synthetic StepBatch with realistic state repetition (see the module docstring)."""
    rng = torch.Generator().manual_seed(seed)
    per_group = max(1, num_trajectories // num_groups)
    num_traj = num_groups * per_group
    n = num_traj * steps
    state_obs = [[("Welcome to task %d. Your task is to: put a clean mug in the cabinet." % g) if s == 0
                  else _observation(s, rng) for s in range(states_per_group)] for g in range(num_groups)]
    scale = hidden_size ** -0.5          # unit-size vectors: cosines read directly off the noise sizes
    room_vec = torch.randn(num_groups, len(ROOMS), hidden_size, generator=rng) * scale
    own_vec = torch.randn(num_groups, states_per_group, hidden_size, generator=rng) * scale
    room_of = torch.arange(states_per_group) % len(ROOMS)
    base = room_vec[:, room_of] * 0.6 + own_vec                                    # [G, S, d]

    group = torch.arange(num_groups).repeat_interleave(per_group * steps)
    traj = torch.arange(num_traj).repeat_interleave(steps)
    step = torch.arange(steps).repeat(num_traj)
    # random walk on a ring of states with jumps; step 0 is the shared intro observation
    moves = torch.randint(-2, 3, (num_traj, steps), generator=rng)
    jumps = torch.rand(num_traj, steps, generator=rng) < 0.1
    moves = torch.where(jumps, torch.randint(0, states_per_group, moves.shape, generator=rng), moves)
    moves[:, 0] = 0
    state = (torch.cumsum(moves, dim=1) % (states_per_group - 1)) + 1
    state[:, 0] = 0
    state = state.reshape(-1)
    # novel observations: seen once (an opened receptacle, a changed inventory); some are near
    # duplicates of the walk's state in hidden space, the others point somewhere new in the same room
    novel = (torch.rand(n, generator=rng) < novel_rate) & (step > 0)
    near = torch.rand(n, generator=rng) < near_duplicate_rate
    fresh = torch.randn(n, hidden_size, generator=rng) * scale
    state_vec = base[group, state]
    novel_vec = torch.where(near[:, None], state_vec + 0.2 * fresh, room_vec[group, room_of[state]] * 0.6 + fresh)
    noise_scale = 0.1 + 0.35 * torch.rand(n, 1, generator=rng)
    hidden = torch.where(novel[:, None], novel_vec, state_vec)
    hidden = hidden + noise_scale * torch.randn(n, hidden_size, generator=rng) * scale

    invalid = torch.rand(n, generator=rng) < 0.10
    won = torch.rand(num_traj, generator=rng) < 0.35
    invalid_penalty = torch.where(invalid, torch.tensor(0.1), torch.tensor(0.0))
    last = step == steps - 1
    env_reward = torch.where(last & won[traj], torch.tensor(10.0), torch.tensor(0.0))
    reward = env_reward - invalid_penalty
    action_choice = torch.randint(0, 4, (n,), generator=rng)
    actions = [f"go to {ROOMS[(s + a) % len(ROOMS)]} {1 + a}" if not bad else ""
               for s, a, bad in zip(state.tolist(), action_choice.tolist(), invalid.tolist())]
    response_len = 24
    response = torch.randint(10, 30000, (n, response_len), generator=rng)
    response[:, :8] = (state[:, None] * 7 + action_choice[:, None] * 131 + torch.arange(8)) % 30000
    episode_return = torch.zeros(num_traj).index_add_(0, traj, reward)[traj]
    anchor_obs = [_novel_observation(s, t, k) if new else state_obs[g][s]
                  for g, t, k, s, new in zip(group.tolist(), traj.tolist(), step.tolist(), state.tolist(),
                                             novel.tolist())]
    return StepBatch(
        group_id=group, traj_id=traj, step=step,
        prompt_ids=torch.ones(n, 4, dtype=torch.int64), prompt_lengths=torch.full((n,), 4),
        response_ids=response, response_mask=torch.ones(n, response_len), rollout_logprobs=torch.zeros(n, response_len),
        env_reward=env_reward, invalid_penalty=invalid_penalty, noop_penalty=torch.zeros(n), done=last,
        episode_return=episode_return, success=won[traj], action_valid=~invalid,
        is_expert=torch.zeros(n, dtype=torch.bool), policy_version=torch.zeros(n, dtype=torch.int64),
        anchor_obs=anchor_obs, action=actions, task_type=["pick_clean_then_place"] * n, hidden=hidden,
    ).with_anchor_keys()       # what the rollout engine records


def workload_stats(batch: StepBatch, eps: float = 0.10) -> dict[str, float]:
    """Observation-hash and BiGPO (seed centroids, radius eps) singleton rates and group sizes."""
    group, num_groups = batch.group_segments()
    anchor, num_anchor = common.anchor_segments(batch, group)
    cluster, num_clusters = greedy_cosine_clusters(batch.hidden, group, num_groups, eps)
    # the exact greedy pass needs every row's cosine with every seed created before it in its group
    first = torch.full((num_clusters,), len(batch), dtype=torch.int64).scatter_reduce_(
        0, cluster, torch.arange(len(batch)), reduce="amin")
    is_seed = torch.zeros(len(batch), dtype=torch.int64)
    is_seed[first] = 1
    order = torch.argsort(group, stable=True)
    within = torch.cumsum(is_seed[order], 0)
    group_start = torch.cumsum(torch.bincount(group, minlength=num_groups), 0) - torch.bincount(group, minlength=num_groups)
    seeds_before = within - is_seed[order] - (within - is_seed[order])[group_start][group[order]]
    pairs = int(seeds_before.sum())
    return {
        "obs_hash_singleton_rate": round(common.singleton_rate(anchor, num_anchor), 4),
        "obs_hash_groups_per_group": round(num_anchor / num_groups, 1),
        "obs_hash_mean_size": round(common.mean_segment_size(anchor, num_anchor), 2),
        "bigpo_eps": eps,
        "bigpo_singleton_rate": round(common.singleton_rate(cluster, num_clusters), 4),
        "bigpo_clusters_per_group": round(num_clusters / num_groups, 1),
        "bigpo_mean_size": round(common.mean_segment_size(cluster, num_clusters), 2),
        "bigpo_row_seed_pairs": pairs,
        "bigpo_gflop": round(2 * pairs * batch.hidden.shape[1] / 1e9, 3),
    }


def gemm_gflops(hidden_size: int, rows: int = 64, seeds: int = 120, repeats: int = 50) -> float:
    """Achieved float32 ``torch.mm`` rate at the clustering's shapes (a block of rows x the seeds)."""
    a, b = torch.randn(rows, hidden_size), torch.randn(seeds, hidden_size)
    torch.mm(a, b.t())
    seconds = _time_ms(lambda: torch.mm(a, b.t()), repeats) / 1e3
    return 2 * rows * seeds * hidden_size / seconds / 1e9


def _time_ms(fn, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs)


def add_arguments(parser) -> None:
    parser.add_argument("--trajectories", type=int, default=128, help="trajectories in the batch (default 128)")
    parser.add_argument("--groups", type=int, default=16, help="task groups (default 16)")
    parser.add_argument("--steps", type=int, default=50, help="steps per trajectory (default 50)")
    parser.add_argument("--hidden-size", type=int, default=3584, help="hidden state size (default 3584)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per estimator; the median is reported")
    parser.add_argument("--only", nargs="*", default=None, help="case labels to run (default: all)")
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    batch = make_workload(args.trajectories, args.groups, args.steps, args.hidden_size, seed=args.seed)
    workload = {"records": len(batch), "trajectories": batch.num_trajectories, "groups": batch.num_groups,
                "hidden_size": args.hidden_size, **workload_stats(batch)}
    workload["gemm_gflops"] = round(gemm_gflops(args.hidden_size), 1)
    workload["bigpo_gemm_bound_ms"] = round(workload["bigpo_gflop"] / workload["gemm_gflops"] * 1e3, 1)
    results: dict[str, dict[str, float]] = {}
    ok = True
    string_batch = batch.with_columns(anchor_key=None)
    for label, name, params in CASES:
        if args.only and label not in args.only:
            continue
        case_batch = string_batch if label in WITHOUT_ANCHOR_KEYS else batch
        fast, diagnostics = compute_advantages(name, case_batch, **params)       # warm-up and output check
        ms = _time_ms(lambda: compute_advantages(name, case_batch, **params), args.repeats)
        reference_runs: list[float] = []           # the slow references run once, the fast ones repeat
        while len(reference_runs) < args.repeats and sum(reference_runs) < REFERENCE_BUDGET_MS:
            start = time.perf_counter()
            reference = reference_advantages(name, case_batch, **params)
            reference_runs.append((time.perf_counter() - start) * 1e3)
        reference_ms = statistics.median(reference_runs)
        diff = (fast.double() - reference).abs()
        agree = bool((diff <= 1e-6 + 1e-6 * reference.abs()).all())
        ok &= agree
        results[label] = {"ms": round(ms, 3), "reference_ms": round(reference_ms, 1),
                          "reference_runs": len(reference_runs),
                          "speedup": round(reference_ms / ms, 1), "max_abs_diff": float(diff.max()),
                          "agree": agree}
        for key in ("singleton_rate", "obs_hash_singleton_rate", "step_group_singleton_rate", "mean_cluster_size"):
            if key in diagnostics:
                results[label][key] = round(diagnostics[key], 4)
    summary = {
        "workload": workload,
        "cpu": cpu_name(), "torch_threads": torch.get_num_threads(),
        "bigpo_path": describe_path(),       # compiled decisions / bfloat16 screen, or why not
        "estimators": results, "all_agree": ok,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{len(batch)} step records, {batch.num_groups} groups, hidden {args.hidden_size}; "
              f"{summary['cpu']}, {summary['torch_threads']} torch threads; BiGPO seed pass: "
              f"{summary['bigpo_path']}")
        print(f"observation-hash singletons {workload['obs_hash_singleton_rate']:.1%} "
              f"({workload['obs_hash_groups_per_group']:g} anchor groups per group); BiGPO eps "
              f"{workload['bigpo_eps']:g}: singletons {workload['bigpo_singleton_rate']:.1%} "
              f"({workload['bigpo_clusters_per_group']:g} clusters per group)")
        print(f"BiGPO exact pass: {workload['bigpo_gflop']:g} GFLOP of row-seed cosines; float32 torch.mm at "
              f"{workload['gemm_gflops']:g} GFLOP/s here would take {workload['bigpo_gemm_bound_ms']:g} ms")
        print(f"{'estimator':26s} {'ms':>8s} {'reference ms':>13s} {'speed-up':>9s}  agree")
        for label, r in results.items():
            print(f"{label:26s} {r['ms']:8.2f} {r['reference_ms']:13.1f} {r['speedup']:8.1f}x  {r['agree']}")
    return 0 if ok else 1
