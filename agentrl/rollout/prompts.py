"""Prompts for one environment step, in the reference framework's structure.

Every step's prompt is one user message rendered with the model's chat template. It holds the
task, the last K (observation, action) pairs, the current observation and the admissible
actions, then the instruction to answer with ``<think>...</think>`` (optional) and
``<action>...</action>``. Step 0 (or K = 0) uses the template without history.

What differs between environments is declared by each in its spec's ``prompt``
(:class:`agentrl.envs.spec.PromptSpec`): the preamble, advice after the instruction, where the
task line comes from and how admissible actions are listed.

``style="full"`` follows verl-agent's wording structure for each environment; ``style="compact"``
keeps the same content without the preamble sentences (shorter prompts for tiny CPU models);
``style="compact_task_last"`` moves its task line after the observation, next to the answer, where
a tiny model finds the goal's object to copy into ``take``/``move`` (ALFWorld, docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.envs.spec import env_spec_or_default

THINK_INSTRUCTION = (
    "Now it's your turn to take an action. You should first reason step-by-step about the current situation; "
    "this reasoning MUST be enclosed within <think> </think> tags. Once you have finished reasoning, choose one "
    "admissible action for the current step and present it within <action> </action> tags."
)
ACTION_INSTRUCTION = (
    "Now it's your turn to take an action. Choose one admissible action for the current step and present it "
    "within <action> </action> tags."
)


@dataclass
class History:
    """Observations (before each action) and the parsed actions of one episode so far."""

    observations: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    def add(self, observation: str, action: str) -> None:
        self.observations.append(observation)
        self.actions.append(action)

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def last_action(self) -> str:
        """The action of the latest step ("" before the first; a step without a parsed action is "")."""
        return (self.actions[-1] or "") if self.actions else ""

    def entries(self, current_observation: str, count_repeats: bool = False) -> list[tuple[int, int]]:
        """The history as (first step, steps) entries, oldest first.

        Without ``count_repeats`` every step is its own entry. With it, a run of consecutive steps
        that took the same action and got the same result (the observation after it) is one entry:
        ``craft 1 glowstone using 4 glowstone dust`` three times in a row, each ``Crafted 1
        minecraft:glowstone``, reads as one step done three times. The result of the last step is
        ``current_observation``.
        """
        n = len(self)
        results = self.observations[1:] + [current_observation]
        out: list[tuple[int, int]] = []
        for i in range(n):
            if (count_repeats and out and self.actions[i] == self.actions[i - 1]
                    and results[i] == results[i - 1]):
                first, steps = out[-1]
                out[-1] = (first, steps + 1)
            else:
                out.append((i, 1))
        return out

    def render(self, entries: list[tuple[int, int]]) -> str:
        """History lines for ``entries`` (from :meth:`entries`), one per line."""
        lines = []
        for first, steps in entries:
            obs, action = self.observations[first], self.actions[first]
            if steps == 1:
                lines.append(f"[Observation {first + 1}: '{obs}', Action {first + 1}: '{action}']")
            else:
                lines.append(f"[Observation {first + 1}: '{obs}', Actions {first + 1}-{first + steps}: "
                             f"'{action}' ({steps} times)]")
        return "\n".join(lines)


def task_text(env_name: str, reset_observation: str, reset_info: dict, step_info: dict | None = None) -> str:
    """What the prompt shows as the task on the current step.

    With the environment's ``prompt.task_source="first_observation"`` (TextCraft: its crafting
    commands appear only in the first observation, yet every later step needs them) it is that whole
    first observation. Otherwise it is the instruction the environment reports in ``info["task"]``:
    the current step's ``step_info`` when it reports one (ALFWorld's ``unvisited_in_task`` notes
    change every step), else the reset's.
    """
    if env_spec_or_default(env_name).prompt.task_source == "first_observation":
        return reset_observation
    if step_info and step_info.get("task"):
        return str(step_info["task"])
    return str(reset_info.get("task", ""))


def format_admissible(actions: list[str], env_name: str) -> str:
    actions = [a for a in actions if a != "help"]
    if env_spec_or_default(env_name).prompt.admissible_layout == "lines":
        return "\n " + "\n ".join(actions) + "\n"
    return ", ".join(f"'{a}'" for a in actions)


def build_prompt_text(env_name: str, task: str, observation: str, history: History, admissible: list[str],
                      history_length: int = 2, think: bool = True, style: str = "full",
                      count_repeats: bool = False) -> str:
    """The user-message text of one step. ``count_repeats`` shows a run of identical steps (same
    action, same result) as one history entry with its count (``env.history_count_repeats``);
    ``history_length`` then counts entries."""
    declared = env_spec_or_default(env_name).prompt
    instruction = (THINK_INSTRUCTION if think else ACTION_INSTRUCTION) + declared.advice
    actions = format_admissible(admissible, env_name) if admissible else ""
    lines: list[str] = []
    steps_done = len(history)
    window = history.entries(observation, count_repeats)[-history_length:] if history_length > 0 else []
    use_history = bool(window)
    shown = sum(steps for _, steps in window)
    rendered = history.render(window)
    if style in ("compact", "compact_task_last"):
        if style == "compact":
            lines.append(f"Task: {task}")
        if use_history:
            lines.append(f"Last {shown} of {steps_done} steps:\n{rendered}")
        if observation != task:
            lines.append(f"Observation: {observation}")
        if actions:
            lines.append(f"Admissible actions: [{actions}]")
        if style == "compact_task_last":
            lines.append(f"Task: {task}")
        lines.append("Answer with <action> </action>." if not think else instruction)
        return "\n".join(lines)
    if style != "full":
        raise ValueError(f"unknown prompt style {style!r}: use full, compact or compact_task_last")
    preamble = declared.preamble
    if not use_history:
        lines.append(f"{preamble} Your task is to: {task}")
        if observation != task:  # task_source="first_observation": the first observation is the task itself
            lines.append(f"Your current observation is: {observation}")
    else:
        lines.append(f"{preamble} Your task is to: {task}")
        lines.append(f"Prior to this step, you have already taken {steps_done} step(s). Below are the most recent "
                     f"{shown} observations and the corresponding actions you took:\n{rendered}")
        lines.append(f"You are now at step {steps_done + 1} and your current observation is: {observation}")
    if actions:
        lines.append(f"Your admissible actions of the current situation are: [{actions}].")
    lines.append("")
    lines.append(instruction)
    return "\n".join(lines)


def render_chat(tokenizer, user_text: str) -> str:
    """The prompt string the model sees: the chat template with the generation prompt appended."""
    return tokenizer.apply_chat_template([{"role": "user", "content": user_text}], add_generation_prompt=True,
                                         tokenize=False)


def format_response(action: str, thought: str | None = None) -> str:
    """A well-formed response (used for expert demonstrations in SFT)."""
    if thought is not None:
        return f"<think>{thought}</think><action>{action}</action>"
    return f"<action>{action}</action>"
