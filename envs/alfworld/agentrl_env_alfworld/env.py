"""ALFWorld as an agentrl :class:`~agentrl.envs.base.TextEnv`, on the real TextWorld engine.

Every observation, feedback string and admissible command is what ALFWorld's engine prints
(``PddlEnv`` + ``AlfredDemangler``); this class only addresses games by ``(split, index)``, keeps
the step count (``max_steps``, 50 as in ALFWorld's configs) and fills the common ``info`` keys.

One change to the text, on by default as in the LLM-agent frameworks: the initial observation's
TextWorld banner ``-= Welcome to TextWorld, ALFRED! =-`` and the blank line after it are removed
(``strip_banner=False`` keeps the engine's text verbatim).

``room_in_task=True`` makes ``info["task"]`` (what prompts show as the task on every step) the
room line of the first observation followed by the task line, so a policy that sees only the last
few steps still sees the receptacle list: the searching expert
(:func:`agentrl_env_alfworld.expert.search_action`) visits receptacles in that list's order.

``unvisited_in_task=True`` adds a line of notes to that task, rebuilt after every step: ``Not
visited yet: cabinet 3, cabinet 2, ...``, the listed receptacles (in the listed order) the agent
has not yet been at. "Been at" is read off the engine's own feedback, the receptacle an observation
is about (``You arrive at R``, ``You open the R``, ``On the R, you see``: what
:func:`agentrl_env_alfworld.expert.observed_receptacle` reads), so the notes hold nothing an
agent reading its whole transcript could not write itself. It keeps a policy that sees only the
last few steps from walking in circles; along the searching expert's episodes the first name of the
line is the receptacle it visits next.
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from agentrl_env_alfworld.engine import ENGINE_LOCK
from agentrl_env_alfworld.expert import listed_receptacles, observed_receptacle, parse_goal, search_action
from agentrl_env_alfworld.tasks import SPLITS, TASK_TYPE_SHORT_NAMES, TRAJ_FILE, list_split_games, task_line
from agentrl.envs.base import TaskRef, TextEnv

BANNER = "-= Welcome to TextWorld, ALFRED! =-\n\n"
PICKED_UP = re.compile(r"You pick up the (.+?) from the ")
PUT_DOWN = re.compile(r"You move the (.+?) to the ")
NOTHING_HAPPENS = "Nothing happens."    # the engine's answer to any command not admissible (info["noop"])


@functools.lru_cache(maxsize=16)
def _split_listing(root: str, split: str) -> tuple[str, ...]:
    return tuple(list_split_games(root, split))


class ALFWorldEnv(TextEnv):
    """ALFWorld text games, served from ``train``, ``valid_seen`` and ``valid_unseen``.

    Games are listed in sorted path order, so ``TaskRef("valid_seen", 3)`` names the same game on
    every machine. ``info`` adds ``task_type_short`` (Pick, Look, Clean, Heat, Cool, Pick2) and
    ``gamefile`` to the common keys.
    """

    name = "alfworld"

    def __init__(self, max_steps: int = 50, data_dir: str | None = None, strip_banner: bool = True,
                 generated_counts: dict[str, int] | None = None, generated_seed: int = 0,
                 generated_solver: str = "expert", generated_rooms: list[str] | None = None,
                 generated_task_types: list[str] | None = None, room_in_task: bool = False,
                 unvisited_in_task: bool = False, held_in_task: bool = False):
        super().__init__(max_steps=max_steps)
        from agentrl_env_alfworld.data import resolve_data_dir

        self.data_dir = resolve_data_dir(data_dir, generated_counts, generated_seed, generated_solver,
                                         generated_rooms, generated_task_types)
        self.strip_banner = bool(strip_banner)
        self.room_in_task = bool(room_in_task)
        self.unvisited_in_task = bool(unvisited_in_task)
        self.held_in_task = bool(held_in_task)
        self._held: str | None = None           # what the engine's feedback says the agent carries
        self._listed: list[str] | None = None   # receptacles of the room line, in the listed order
        self._visited: list[str] = []           # receptacles the agent has been at, first visit first
        self._place_feedback: str | None = None  # the latest feedback that names the agent's place
        self._goal_line = ""
        self._engine = None
        self._state = None
        self._game_path: str | None = None
        self._traj: dict[str, Any] = {}
        self._task_line = ""

    # ----- data ---------------------------------------------------------------------------------
    def games(self, split: str) -> tuple[str, ...]:
        return _split_listing(self.data_dir, split)

    def split_sizes(self) -> dict[str, int]:
        return {split: len(self.games(split)) for split in SPLITS if self.games(split)}

    # ----- protocol -----------------------------------------------------------------------------
    def _reset_task(self, task: TaskRef) -> tuple[str, dict[str, Any]]:
        from agentrl_env_alfworld.engine import load_engine_env, load_game
        from agentrl_env_alfworld.engine_reset import collector_paused

        path = self.games(task.split)[task.index]
        with open(os.path.join(os.path.dirname(path), TRAJ_FILE)) as f:
            self._traj = json.load(f)
        with ENGINE_LOCK, collector_paused():   # engine_reset: collections walk every live object
            if self._engine is None:
                self._engine = load_engine_env(path)
            else:
                load_game(self._engine, path)
            self._game_path = path
            self._state = self._engine.reset()
        intro = self._state.feedback
        obs = intro[len(BANNER):] if self.strip_banner and intro.startswith(BANNER) else intro
        self._task_line = task_line(intro)
        if self.room_in_task:
            room = next((line for line in obs.splitlines() if line.startswith("You are in the middle of a room")), "")
            self._task_line = f"{room}\n{self._task_line}" if room else self._task_line
        self._goal_line = task_line(intro)
        try:
            self._listed = listed_receptacles(obs)
        except ValueError:
            if self.unvisited_in_task:
                raise
            self._listed = None
        self._visited, self._place_feedback, self._held = [], None, None
        return obs, self._info()

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        with ENGINE_LOCK:
            self._state, score, done = self._engine.step(action)
        here = observed_receptacle(self._state.feedback)
        if here is not None:
            self._place_feedback = self._state.feedback
            if here not in self._visited:
                self._visited.append(here)
        feedback = self._state.feedback.strip()
        if (picked := PICKED_UP.match(feedback)) is not None:
            self._held = picked.group(1)
        elif PUT_DOWN.match(feedback) is not None:
            self._held = None
        info = self._info()
        info["noop"] = feedback == NOTHING_HAPPENS
        return self._state.feedback, float(score), bool(done), info

    def expert_next_action(self) -> str:
        """The searching expert's command for the current state, whichever way the agent got here
        (DAgger labels): its rule (:func:`~agentrl_env_alfworld.expert.search_action`) on the latest
        feedback, the agent's place and the receptacles already visited. After ``Nothing happens.``
        nothing changed, so the rule reads the latest feedback that showed the agent's place (a
        closed receptacle is still to be opened, a visible object still to be taken)."""
        if self._game_path is None:
            raise RuntimeError("alfworld: expert_next_action() called before reset()")
        if self._listed is None:
            raise RuntimeError(f"alfworld: the first observation of {self._game_path} lists no receptacles")
        feedback = self._state.feedback
        if feedback.strip() == NOTHING_HAPPENS and self._place_feedback is not None:
            feedback = self._place_feedback
        here = observed_receptacle(self._place_feedback) if self._place_feedback else None
        return search_action(parse_goal(self._goal_line), self._listed, feedback,
                             list(self._state["admissible_commands"]), here=here, visited=self._visited)

    def _task(self) -> str:
        """The task the prompt shows on this step (``info["task"]``)."""
        if not (self.unvisited_in_task or self.held_in_task):
            return self._task_line
        *room, goal = self._task_line.split("\n")
        notes = []
        if self.unvisited_in_task:
            left = [r for r in self._listed if r not in self._visited]
            notes.append(f"Not visited yet: {', '.join(left) if left else 'none'}.")
        if self.held_in_task:
            notes.append(f"Carrying: {self._held or 'nothing'}.")
        return "\n".join([*room, *notes, goal])

    def _info(self) -> dict[str, Any]:
        task_type = self._traj.get("task_type", "")
        return {
            "admissible_actions": list(self._state["admissible_commands"]),
            "won": bool(self._state["won"]),
            "task": self._task(),
            "task_type": task_type,
            "task_type_short": TASK_TYPE_SHORT_NAMES.get(task_type, task_type),
            "depth": None,
            "gamefile": self._game_path,
        }

    def expert_actions(self) -> list[str]:
        """The game's stored walkthrough, else a plan from the expert on the initial state."""
        if self._game_path is None:
            raise RuntimeError("alfworld: expert_actions() called before reset()")
        with open(self._game_path) as f:
            walkthrough = json.load(f).get("walkthrough")
        if walkthrough:
            return list(walkthrough)
        from agentrl_env_alfworld.engine import load_engine_env
        from agentrl_env_alfworld.expert import expert_plan

        with ENGINE_LOCK:
            state = load_engine_env(self._game_path).reset()
        return expert_plan(self._traj["task_type"], self._traj["pddl_params"],
                           state["_facts"], state["_entity_infos"])
