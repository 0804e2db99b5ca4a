"""DAgger demonstrations: the policy drives, the expert labels every state it reaches.

SFT on the expert's own episodes shows a policy only the states the expert visits. Once the policy
errs it is somewhere no demonstration went (ALFWorld's tiny warm start answers ``take X from R``
with nothing in view, the engine says ``Nothing happens.``, and the policy repeats itself to the
step limit). One DAgger pass (Ross, Gordon and Bagnell, 2011) plays the policy greedily on training
tasks and asks the env's step-wise expert (``TextEnv.expert_next_action``) what to do at every state
of those episodes; each (prompt, expert action) pair is one more SFT example::

    demos = policy_demonstrations("alfworld", env_kwargs, "train", indices, model_dir=..., rollout_cfg=cfg.rollout,
                                  history_length=2, count_repeats=False, workers=2)

The prompts are built exactly as the rollout engine builds them (task of the current step, the
last ``history_length`` steps, the same style and admissible-list setting); actions are generated
greedily with the torch backend, parsed as the rollout parses them, and sent to the env as the
rollout sends them. A state whose prompt already appeared earlier in the same episode (a policy
repeating a failing action sees the same prompt again) is kept once. Labelling stops at the first
state the expert cannot answer (its rule raises), and the state is counted in ``unlabelled``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from agentrl.envs import TaskRef, make_env
from agentrl.generation import make_backend
from agentrl.models import load_tokenizer, stop_token_ids
from agentrl.rollout.engine import encode_prompts, make_sampling_params
from agentrl.rollout.parsing import parse_response, shown_action
from agentrl.rollout.prompts import History, build_prompt_text, format_response, task_text
from agentrl.warmstart.demonstrations import Demonstration
from agentrl.warmstart.process_pool import spawned_pool


@dataclass
class DaggerResult:
    demonstrations: list[Demonstration] = field(default_factory=list)
    episodes: int = 0
    won: int = 0            # episodes the policy won on its own
    states: int = 0         # states the policy reached (before de-duplication)
    disagreements: int = 0  # kept states where the policy's action was not the expert's
    unlabelled: int = 0     # episodes whose labelling stopped at a state the expert could not answer

    def merge(self, other: "DaggerResult") -> "DaggerResult":
        return DaggerResult(self.demonstrations + other.demonstrations, self.episodes + other.episodes,
                            self.won + other.won, self.states + other.states,
                            self.disagreements + other.disagreements, self.unlabelled + other.unlabelled)

    def summary(self) -> dict:
        return {"dagger_episodes": self.episodes, "dagger_policy_won": self.won, "dagger_states": self.states,
                "dagger_examples": len(self.demonstrations), "dagger_disagreements": self.disagreements,
                "dagger_unlabelled_episodes": self.unlabelled}


def policy_demonstrations(env_name: str, env_kwargs: dict, split: str, indices: Sequence[int], *, model_dir: str,
                          rollout_cfg, history_length: int, count_repeats: bool, max_steps: int,
                          batch: int = 32, workers: int = 1) -> DaggerResult:
    """Play the policy in ``model_dir`` greedily on ``split``'s tasks ``indices`` and label every
    state with the env's expert (see the module text). With ``workers`` > 1 the tasks are played in
    that many spawned processes; the result is the same, in the order of ``indices``."""
    indices = [int(i) for i in indices]
    args = (env_name, dict(env_kwargs), split, model_dir, rollout_cfg, history_length, count_repeats, max_steps,
            batch)
    workers = max(1, min(workers, len(indices)))
    if workers == 1:
        return _play_and_label(indices, *args)

    chunks = [indices[w::workers] for w in range(workers)]
    with spawned_pool(workers, "the DAgger pass") as pool:
        parts = [f.result() for f in [pool.submit(_play_and_label, chunk, *args, threads=1) for chunk in chunks]]
    result = DaggerResult()
    for part in parts:
        result = result.merge(part)
    order = {index: k for k, index in enumerate(indices)}
    result.demonstrations.sort(key=lambda d: (order[d.task.index], d.step))
    return result


def _play_and_label(indices: list[int], env_name: str, env_kwargs: dict, split: str, model_dir: str, rollout_cfg,
                    history_length: int, count_repeats: bool, max_steps: int, batch: int,
                    threads: int | None = None) -> DaggerResult:
    import torch

    if threads:
        torch.set_num_threads(threads)
    tokenizer = load_tokenizer(model_dir)
    backend = make_backend("auto", model_dir)      # on CPU: the torch engine
    sampling = make_sampling_params(rollout_cfg, stop_token_ids(tokenizer), temperature=0.0)
    prompt = dict(history_length=history_length, think=rollout_cfg.enable_thinking, style=rollout_cfg.prompt_style,
                  count_repeats=count_repeats)
    envs = [make_env(env_name, **env_kwargs) for _ in range(min(batch, len(indices)))]
    result = DaggerResult()
    for start in range(0, len(indices), len(envs)):
        tasks = [TaskRef(split, i) for i in indices[start:start + len(envs)]]
        episodes = [_Episode(env, task, env_name, prompt["think"]) for env, task in zip(envs, tasks)]
        for _ in range(max_steps):
            active = [e for e in episodes if not e.done]
            if not active:
                break
            texts = [e.prompt_text(rollout_cfg.show_admissible, prompt) for e in active]
            for e, text in zip(active, texts):
                e.label(text, result)
            ids, _ = encode_prompts(tokenizer, texts, rollout_cfg, env_name)
            responses = tokenizer.batch_decode([g.token_ids for g in backend.generate(ids, sampling)],
                                               skip_special_tokens=True)
            for e, response in zip(active, responses):
                e.act(parse_response(response, env_name, require_think=rollout_cfg.enable_thinking).action, result)
        for e in episodes:
            result.episodes += 1
            result.won += e.won
            result.demonstrations += e.demonstrations
    return result


class _Episode:
    """One task played by the policy, with the expert's label of every state."""

    def __init__(self, env, task: TaskRef, env_name: str, think: bool):
        self.env, self.task, self.env_name, self.think = env, task, env_name, bool(think)
        self.obs, self.info = env.reset(task)
        self.reset_obs, self.reset_info = self.obs, self.info
        self.history = History()
        self.step = 0
        self.done = self.won = False
        self.expert_action: str | None = None
        self.seen: set[str] = set()
        self.demonstrations: list[Demonstration] = []

    def prompt_text(self, show_admissible: bool, prompt: dict) -> str:
        admissible = (self.info.get("admissible_actions") or []) if show_admissible else []
        return build_prompt_text(self.env_name, task_text(self.env_name, self.reset_obs, self.reset_info, self.info),
                                 self.obs, self.history, admissible, **prompt)

    def label(self, text: str, result: DaggerResult) -> None:
        result.states += 1
        self.expert_action = None
        if text in self.seen:
            return
        try:
            action = self.env.expert_next_action()
        except RuntimeError:
            result.unlabelled += 1
            self.done = True    # the episode ends here: its further states would not be labelled
            return
        self.seen.add(text)
        self.expert_action = shown_action(action, self.env_name)
        thought = f"The next step toward the goal is: {self.expert_action}." if self.think else None
        self.demonstrations.append(Demonstration(
            text, format_response(self.expert_action, thought), str(self.info["task_type"]), self.task, self.step,
            dagger=True, previous_action=self.history.last_action))

    def act(self, action: str, result: DaggerResult) -> None:
        if self.expert_action is not None and action != self.expert_action:
            result.disagreements += 1
        if self.done:
            return
        self.history.add(self.obs, action)
        self.obs, _reward, terminated, truncated, self.info = self.env.step(action)
        self.step += 1
        self.won = bool(self.info.get("won"))
        self.done = terminated or truncated


__all__ = ["DaggerResult", "policy_demonstrations"]
