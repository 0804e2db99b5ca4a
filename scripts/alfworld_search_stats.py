"""Measure the searching ALFWorld expert on generated games, per room kind and task family.

For every (room kind, family) it generates ``--n`` games with the offline generator (scenes of that
room kind only), plays the searching expert (:func:`agentrl_env_alfworld.expert.search_action`)
in the real engine and prints one JSON line per game: won, episode length, the omniscient plan's
length, engine seconds (wall and CPU) per step and per reset, and the first observation's size.
``--summary`` prints per-room receptacle counts of all train scenes first (no engine needed).

    python scripts/alfworld_search_stats.py --n 3 --tokenizer PATH/tokenizer.json > stats.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def receptacle_counts() -> dict[str, dict]:
    from agentrl_env_alfworld.scenes import ROOM_KINDS, load_scene, room_kind, scene_numbers

    per_room: dict[str, list[int]] = {k: [] for k in ROOM_KINDS}
    for split in ("train", "valid_unseen"):
        for n in scene_numbers(split):
            per_room[room_kind(n)].append(len(load_scene(n).receptacles))
    return {k: {"scenes": len(v), "mean": round(statistics.mean(v), 1), "median": statistics.median(v),
                "min": min(v), "max": max(v)} for k, v in per_room.items()}


def main(argv=None) -> int:
    from agentrl_env_alfworld.tasks import TASK_TYPES
    from agentrl_env_alfworld.scenes import ROOM_KINDS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3, help="games per (room kind, family)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rooms", nargs="*", default=list(ROOM_KINDS))
    parser.add_argument("--families", nargs="*", default=list(TASK_TYPES))
    parser.add_argument("--vary-scenes", action="store_true",
                        help="a generation seed per family (else all families draw the same scenes)")
    parser.add_argument("--max-steps", type=int, default=120, help="cap on a searching episode")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer.json to count first-observation tokens")
    parser.add_argument("--summary", action="store_true", help="print receptacle counts per room kind first")
    args = parser.parse_args(argv)

    from agentrl_env_alfworld.engine import load_engine_env
    from agentrl_env_alfworld.expert import SearchExpert
    from agentrl_env_alfworld.generate import generate_game

    tok = None
    if args.tokenizer:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(args.tokenizer)
    if args.summary:
        print(json.dumps({"receptacles_per_scene": receptacle_counts()}), flush=True)
    for room in args.rooms:
        for family in args.families:
            for k in range(args.n):
                # with one seed every family draws the same scenes; --vary-scenes gives each its own
                seed = args.seed + 1000 * TASK_TYPES.index(family) if args.vary_scenes else args.seed
                try:
                    game = generate_game(seed, "train", k,
                                         task_types=(family,), rooms=(room,))
                except RuntimeError:
                    print(json.dumps({"room": room, "family": family, "k": k, "skipped": "no such task"}), flush=True)
                    break
                t0, c0 = time.perf_counter(), time.process_time()
                env = load_engine_env(game["game"])
                state = env.reset()
                reset_wall, reset_cpu = time.perf_counter() - t0, time.process_time() - c0
                first = state.feedback
                room_line = first.split("\n\n")[1] if first.startswith("-=") else first.split("\n\n")[0]
                expert = SearchExpert(first)
                obs, steps, won, step_wall, step_cpu = first, 0, False, 0.0, 0.0
                while steps < args.max_steps:
                    action = expert.act(obs, list(state["admissible_commands"]))
                    t0, c0 = time.perf_counter(), time.process_time()
                    state, _, done = env.step(action)
                    step_wall += time.perf_counter() - t0
                    step_cpu += time.process_time() - c0
                    steps += 1
                    obs = state.feedback
                    if state["won"] or done:
                        won = bool(state["won"])
                        break
                row = {"room": room, "family": family, "k": k, "scene": game["traj"]["scene"]["scene_num"],
                       "won": won, "steps": steps, "omniscient_steps": len(game["game"]["walkthrough"]),
                       "receptacles": len(expert.receptacles), "first_obs_chars": len(room_line),
                       "reset_wall_s": round(reset_wall, 3), "reset_cpu_s": round(reset_cpu, 3),
                       "step_wall_s": round(step_wall / steps, 4), "step_cpu_s": round(step_cpu / steps, 4)}
                if tok is not None:
                    row["first_obs_tokens"] = len(tok.encode(room_line).ids)
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
