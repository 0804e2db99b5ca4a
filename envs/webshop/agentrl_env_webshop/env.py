"""WebShop in text mode: a faithful reimplementation of the original benchmark's text environment.

Pages: search -> results (top 50, 10 a page) -> item (option groups; Description, Features and
Reviews sub-pages) -> Buy Now, which scores the purchase and ends the episode.

Actions follow the original exactly:

* ``search[query]``: the query is lowercased and must be non-empty; it is accepted on every page
  (only the start page shows a search bar, so only there is it listed as admissible);
* ``click[x]``: ``x`` is lowercased and must be a clickable of the current page and not ``search``;
* anything else changes nothing: same page, reward 0.

``info["admissible_actions"]`` lists ``search[<your query>]`` when the page has the search bar,
then ``click[x]`` for every clickable, the way the reference training framework presents them.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from agentrl.envs.base import TaskRef, TextEnv
from agentrl_env_webshop import pages
from agentrl_env_webshop.dataset import WebShopData
from agentrl_env_webshop.reward import normalize_color, purchase_reward, token_set_ratio

SEARCH_PLACEHOLDER = "search[<your query>]"
_ACTION = re.compile(r"(.+)\[(.+)\]")
_SUB_PAGE_BY_CLICK = {name.lower(): name for name in pages.SUB_PAGES}


def parse_action(action: str) -> tuple[str, str | None]:
    """``"click[next >]" -> ("click", "next >")``; text without brackets -> ``(text, None)``."""
    match = _ACTION.match(action)
    if match is None:
        return action, None
    return match.group(1), match.group(2)


class WebShopEnv(TextEnv):
    """One WebShop session per episode, on the generated catalogue or the original data."""

    name = "webshop"

    def __init__(self, data: WebShopData, max_steps: int = 15):
        super().__init__(max_steps=max_steps)
        self.data = data
        self.goal: dict[str, Any] | None = None
        self._page = "search"

    # ----- protocol ----------------------------------------------------------------------------
    def split_sizes(self) -> dict[str, int]:
        return {name: len(goals) for name, goals in self.data.splits.items()}

    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        self.goal = self.data.splits[task.split][task.index]
        self._go_to_search_page()
        self.done = False
        self.score: float | None = None
        return self._observation(), self._info()

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.done:
            return self._observation(), 0.0, True, self._info()
        name, arg = parse_action(action)
        arg = arg.lower() if arg is not None else None
        reward = 0.0
        if name == "search" and arg:
            self._search(arg.split(" "), page=1)
        elif name == "click" and arg in self._clickables and arg != "search":
            reward = self._click(arg)
        info = self._info()
        if self.done:
            info["task_score"] = self.score
            info["won"] = self.score == 1.0
        return self._observation(), reward, self.done, info

    # ----- state transitions -------------------------------------------------------------------
    def _go_to_search_page(self) -> None:
        self._page = "search"
        self.keywords: list[str] | None = None
        self.page_number: int | None = None
        self.results: Sequence[dict[str, Any]] = []
        self.asin: str | None = None
        self.visited_asins: set[str] = set()
        self.options: dict[str, str] = {}
        self.sub_page_name: str | None = None
        self._refresh_clickables()

    def _search(self, keywords: list[str], page: int) -> None:
        if keywords != self.keywords:
            self.results = self.data.results(" ".join(keywords))
        self.keywords = keywords
        self.page_number = page
        self.asin = None
        self.options = {}
        self._page = "results"
        self._refresh_clickables()

    def _click(self, clickable: str) -> float:
        page = self._page
        if clickable == "buy now":
            return self._buy()
        if clickable == "back to search":
            self._go_to_search_page()
        elif clickable == "next >" and page == "results":
            self._search(self.keywords, self.page_number + 1)
        elif clickable == "< prev" and page == "results":
            self._search(self.keywords, self.page_number - 1)
        elif clickable == "< prev" and page == "sub":
            self._show_item()
        elif clickable == "< prev" and page == "item":
            self._search(self.keywords, self.page_number)
        elif clickable in _SUB_PAGE_BY_CLICK:
            self.sub_page_name = _SUB_PAGE_BY_CLICK[clickable]
            self._page = "sub"
            self._refresh_clickables()
        else:
            target = self._click_targets.get(clickable)
            if target is None:  # a product link
                self.asin = clickable.upper()
                self.visited_asins.add(self.asin)
            else:  # an option value of the group ``target``
                self.options[target] = clickable
            self._show_item()
        return 0.0

    def _show_item(self) -> None:
        self._page = "item"
        self._refresh_clickables()

    def _buy(self) -> float:
        product = self.data.by_asin[self.asin]
        score, parts = purchase_reward(product, self.goal, self.data.prices[self.asin],
                                       self.options, self.data.nouns)
        self.score = score
        self.reward_parts = parts
        self.done = True
        self._page = "done"
        self._refresh_clickables()
        return score

    # ----- rendering ---------------------------------------------------------------------------
    @property
    def instruction(self) -> str:
        return self.goal["instruction_text"]

    def _page_products(self) -> list[dict[str, Any]]:
        return pages.page_slice(self.results, self.page_number)

    def _refresh_clickables(self) -> None:
        """Recompute the clickables of the current page (option value -> its option group)."""
        targets: dict[str, str | None] = {}
        if self._page == "search":
            clickables = pages.search_clickables()
        elif self._page == "results":
            clickables = pages.results_clickables(self._page_products(), self.page_number)
            targets = {p["asin"].lower(): None for p in self._page_products()}
        elif self._page == "item":
            product = self.data.by_asin[self.asin]
            clickables = pages.item_clickables(product)
            for option_name, values in product["options"].items():
                for value in values:
                    targets[value] = option_name
        elif self._page == "sub":
            clickables = pages.sub_page_clickables()
        else:
            clickables = []
        self._clickables = clickables
        self._click_targets = targets

    def _observation(self) -> str:
        if self._page == "search":
            return pages.search_page(self.instruction)
        if self._page == "results":
            return pages.results_page(self.instruction, self._page_products(), self.page_number,
                                      len(self.results))
        product = self.data.by_asin.get(self.asin) if self.asin else None
        if self._page == "item":
            return pages.item_page(self.instruction, product)
        if self._page == "sub":
            return pages.sub_page(self.instruction, product, self.sub_page_name)
        return pages.done_page(self.asin, self.options, self.score)

    def admissible_actions(self) -> list[str]:
        actions = [SEARCH_PLACEHOLDER] if self._page == "search" else []
        return actions + [f"click[{c}]" for c in self._clickables]

    def _info(self) -> dict[str, Any]:
        return {"admissible_actions": self.admissible_actions(), "task": self.instruction,
                "task_type": self.goal["category"], "depth": None, "page": self._page}

    # ----- expert ------------------------------------------------------------------------------
    def expert_actions(self) -> list[str]:
        """Search with the instruction, page to the target, choose the goal options, buy.

        Falls back to searching the target's title if the instruction does not retrieve it.
        """
        if self.goal is None:
            raise RuntimeError("expert_actions() needs reset() first")
        target = self.goal["asin"]
        actions = []
        for query in (self.instruction.lower(), self.data.by_asin[target]["Title"].lower()):
            actions.append(f"search[{query}]")
            ranked = [p["asin"] for p in self.data.results(query)]
            if target in ranked:
                position = ranked.index(target)
                actions += ["click[next >]"] * (position // pages.PRODUCTS_PER_PAGE)
                break
        else:
            raise RuntimeError(f"target {target} is not retrievable for goal {self.instruction!r}")
        actions.append(f"click[{target.lower()}]")
        actions += [f"click[{v}]" for v in expert_option_choices(self.data.by_asin[target],
                                                                 self.goal["goal_options"])]
        actions.append("click[buy now]")
        return actions


def expert_option_choices(product: dict[str, Any], goal_options: Any) -> list[str]:
    """The option values to click: one per goal option, exact when offered, else the closest."""
    if isinstance(goal_options, dict):
        wanted = list(goal_options.items())
    else:
        wanted = [(None, value) for value in goal_options]
    chosen: dict[str, str] = {}
    for group, value in wanted:
        groups = [group] if group in product["options"] else list(product["options"])
        exact = [g for g in groups if value in product["options"][g]]
        if exact:
            chosen[exact[0]] = value
            continue
        scored = [(token_set_ratio(normalize_color(v), normalize_color(value)), g, v)
                  for g in groups for v in product["options"][g]]
        if scored:
            best_score, best_group, best_value = max(scored, key=lambda s: s[0])
            if best_score > 0:
                chosen[best_group] = best_value
    return list(chosen.values())
