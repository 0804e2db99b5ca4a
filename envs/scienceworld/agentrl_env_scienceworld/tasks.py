"""ScienceWorld's 30 task types and its own train/dev/test variation splits, as agentrl task addresses.

The engine defines, for every task type, which variations (numbered worlds: other substances,
animals, rooms...) belong to its train, dev and test sets (``get_variations_train/dev/test``).
agentrl's splits are exactly those sets, over all 30 task types:

``train`` / ``dev`` / ``test``   every (task type, variation) of that set, ordered round-robin over
                                 the task types in the engine's order (index 0: the first variation of
                                 the first type, index 1: the first variation of the second type, ...,
                                 then the second variations ...), so the first N tasks of a split
                                 cover the task types evenly (``eval.num_tasks``).
``<set>_<task type>``            the variations of one task type in one set (``test_boil``), in
                                 the engine's order.
``<set>_short``                  round-robin like ``<set>``, over the five task types whose gold
                                 paths are shortest (4-7 actions: the three lifespan tasks, find a
                                 non-living thing, mix a secondary colour): a small-model and CPU
                                 setting.

The table ships as ``splits.json`` (so that a split's size is known without starting a JVM) and is
rebuilt from the engine with ``python -m agentrl_env_scienceworld.tasks --write``; a test compares
the shipped table with the engine's.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

SETS = ("train", "dev", "test")
# the task types with the shortest gold paths (4-7 actions), the "<set>_short" splits
SHORT_TASK_TYPES = ("lifespan-longest-lived", "lifespan-shortest-lived", "lifespan-longest-lived-then-shortest-lived",
                    "find-non-living-thing", "chemistry-mix-paint-secondary-color")
TABLE_PATH = Path(__file__).with_name("splits.json")


def build_table(engine) -> dict[str, dict[str, list[int]]]:
    """``{task type: {set: [variation, ...]}}`` read from a started engine, in the engine's order."""
    table: dict[str, dict[str, list[int]]] = {}
    for task_type in engine.get_task_names():
        engine.load(task_type, 0, "")
        table[task_type] = {"train": [int(v) for v in engine.get_variations_train()],
                            "dev": [int(v) for v in engine.get_variations_dev()],
                            "test": [int(v) for v in engine.get_variations_test()]}
    return table


@functools.lru_cache(maxsize=1)
def split_table() -> dict[str, dict[str, list[int]]]:
    with open(TABLE_PATH, encoding="utf-8") as handle:
        return json.load(handle)


@functools.lru_cache(maxsize=1)
def splits() -> dict[str, tuple[tuple[str, int], ...]]:
    """Every split name -> its (task type, variation) addresses."""
    table = split_table()
    out: dict[str, tuple[tuple[str, int], ...]] = {}
    for name in SETS:
        out[name] = round_robin(table, name, list(table))
        out[f"{name}_short"] = round_robin(table, name, SHORT_TASK_TYPES)
        for task_type, sets in table.items():
            out[f"{name}_{task_type}"] = tuple((task_type, v) for v in sets[name])
    return out


def round_robin(table: dict[str, dict[str, list[int]]], set_name: str, types) -> tuple[tuple[str, int], ...]:
    """The variations of ``set_name`` of the task ``types``: the first of each type in turn, then the second..."""
    per_type = [[(task_type, v) for v in table[task_type][set_name]] for task_type in types]
    rounds = max(len(entries) for entries in per_type)
    return tuple(entries[k] for k in range(rounds) for entries in per_type if k < len(entries))


def table_text(table: dict[str, dict[str, list[int]]]) -> str:
    """The table as ``splits.json`` holds it: one line per task type and set."""
    blocks = []
    for task_type, sets in table.items():
        lines = ",\n".join(f'  "{name}": {json.dumps(sets[name])}' for name in SETS)
        blocks.append(f' "{task_type}": {{\n{lines}\n }}')
    return "{\n" + ",\n".join(blocks) + "\n}\n"


def task_types() -> tuple[str, ...]:
    return tuple(split_table())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl_env_scienceworld.tasks",
                                     description="print (or --write) the engine's variation splits")
    parser.add_argument("--write", action="store_true", help=f"write them to {TABLE_PATH.name}")
    args = parser.parse_args(argv)
    from agentrl_env_scienceworld.engine import start_engine

    engine = start_engine()
    try:
        table = build_table(engine)
    finally:
        engine.close()
    text = table_text(table)
    if args.write:
        TABLE_PATH.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    sizes = {name: sum(len(sets[name]) for sets in table.values()) for name in SETS}
    print(f"{len(table)} task types; variations: {sizes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
