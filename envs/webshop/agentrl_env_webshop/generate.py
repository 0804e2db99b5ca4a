"""``python -m agentrl_env_webshop.generate DIR [--num-products N] [--seed S]``: write the
generated catalogue as the original's full data files (``items_shuffle.json``,
``items_ins_v2.json``, ``items_human_ins.json``, plus ``noun_lexicon.json``); default size: the
original's 1,181,436 products. ``make_env("webshop", data_dir=DIR)`` then loads it like the
original data (and caches its index on disk)."""

from __future__ import annotations

import argparse

from agentrl_env_webshop.catalogue import FULL_NUM_PRODUCTS, write_catalogue_files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--num-products", type=int, default=FULL_NUM_PRODUCTS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_catalogue_files(args.out_dir, args.num_products, args.seed))


if __name__ == "__main__":
    main()
