"""``agentrl recipes``: list the shipped recipes with a one-line description each."""

from __future__ import annotations

from agentrl.config import recipe_description, recipe_names

HELP = "list the shipped recipes (name and one-line description)"


def add_arguments(parser) -> None:
    parser.add_argument("filter", nargs="?", default="", help="only names containing this text, e.g. alfworld or tiny")


def run(args) -> int:
    names = [n for n in recipe_names() if args.filter in n]
    width = max((len(n) for n in names), default=0)
    for name in names:
        print(f"{name:<{width}}  {recipe_description(name)}")
    return 0
