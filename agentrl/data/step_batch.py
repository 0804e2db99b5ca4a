"""StepBatch: the one data contract between rollout, learner and estimators.

One row per environment step of every trajectory (the verl-agent convention). Token columns are
right-padded 2-D tensors; ``prompt_lengths`` and ``response_mask`` say which entries are real.
String columns are plain Python lists. Everything is picklable (Ray) and saves to a directory as
``tensors.safetensors`` + ``strings.json`` (no pickle on load).

Columns (N = number of step records); who fills each is in docs/architecture.md:

==================  ================  ===================================================================
column              type / shape      meaning
==================  ================  ===================================================================
group_id            int64 [N]         rollouts compared with each other (same task and seed)
traj_id             int64 [N]         trajectory (episode) id, unique within the batch
step                int64 [N]         step index t inside the trajectory, from 0
prompt_ids          int64 [N, P]      prompt tokens, right-padded with ``pad_id``
prompt_lengths      int64 [N]         real length of each prompt
response_ids        int64 [N, R]      generated tokens, right-padded with ``pad_id``
response_mask       float32 [N, R]    1 for generated tokens that are trained on, else 0
rollout_logprobs    float32 [N, R]    log-probabilities the rollout backend reported (0 on expert rows)
env_reward          float32 [N]       the environment's reward for this step (``env.reward``: the success
                                      reward at the winning step, or the env's own), no penalty in it
invalid_penalty     float32 [N]       the invalid-action penalty charged to this step (0 when its response
                                      held a valid action)
noop_penalty        float32 [N]       the no-op penalty charged to this step (0 unless its valid action
                                      changed nothing and ``rollout.noop_penalty`` > 0)
done                bool [N]          the episode ended at this step (terminated or truncated)
episode_return      float32 [N]       sum of the trajectory's ``reward`` (same on every row of it)
success             bool [N]          the trajectory won (same on every row of it)
action_valid        bool [N]          the response parsed into a valid action
is_expert           bool [N]          an expert-guided step: the env's solver chose it, nothing sampled it
policy_version      int64 [N]         the policy version (learner updates applied) that generated the step
                                      (its first token, when weights changed during the response)
response_versions   int64 [N, R]      optional: the policy version of each response token, when new weights
                                      reached the backend between two tokens of some response (None: every
                                      token is its row's ``policy_version``)
anchor_obs          list[str]         raw env observation the step acted on (no prompt template)
anchor_key          int64 [N]         optional: the collector's number for anchor_obs inside the row's group
                                      (equal strings of a group, equal keys; see below)
action              list[str]         parsed action text ("" when invalid)
task_type           list[str]         task category (per-type metrics and tables)
hidden              float32 [N, d]    actor hidden state at the last prompt token (rollout or learner pass)
old_logprobs        float32 [N, R]    learner log-probs before the update (learner pass)
ref_logprobs        float32 [N, R]    reference-model log-probs (learner pass)
advantages          float32 [N]       one advantage per step record (estimator)
==================  ================  ===================================================================

``reward`` (a property, not stored) is the step's total reward, ``env_reward - invalid_penalty -
noop_penalty``. The columns keep each part as it was made, so an estimator that places a penalty
differently (after discounting, say) reads it instead of undoing a subtraction.

``hidden``, ``old_logprobs``, ``ref_logprobs`` and ``advantages`` are ``None`` until the stage
that fills them has run. ``anchor_key`` is filled by the rollout engine: it numbers the distinct
observations of each group 0, 1, ... once a rollout is done, so two rows of one group have the same
key exactly when their ``anchor_obs`` are equal. The estimators group states by it instead of
hashing 6,400 strings per batch; without it (``None``) they derive the same grouping from
``anchor_obs``. Keys are only comparable inside a group, so ``select``, ``concat`` of whole
groups and :meth:`offset_ids` keep them valid; whoever edits ``anchor_obs`` must drop or renumber
them (:meth:`with_anchor_keys`). ``extras`` holds further per-row tensors (first dimension N) that a
component wants to carry along, e.g. an estimator's per-row loss weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

REQUIRED_TENSORS = (
    "group_id", "traj_id", "step", "prompt_ids", "prompt_lengths", "response_ids", "response_mask",
    "rollout_logprobs", "env_reward", "invalid_penalty", "noop_penalty", "done", "episode_return", "success",
    "action_valid", "is_expert", "policy_version",
)
OPTIONAL_TENSORS = ("hidden", "old_logprobs", "ref_logprobs", "advantages", "anchor_key", "response_versions")
STRING_COLUMNS = ("anchor_obs", "action", "task_type")
TOKEN_COLUMNS = ("prompt_ids", "response_ids", "response_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs",
                 "response_versions")
_DTYPES = {
    "group_id": torch.int64, "traj_id": torch.int64, "step": torch.int64, "prompt_ids": torch.int64,
    "prompt_lengths": torch.int64, "response_ids": torch.int64, "response_mask": torch.float32,
    "rollout_logprobs": torch.float32, "env_reward": torch.float32, "invalid_penalty": torch.float32,
    "noop_penalty": torch.float32, "done": torch.bool, "episode_return": torch.float32, "success": torch.bool,
    "action_valid": torch.bool, "is_expert": torch.bool, "policy_version": torch.int64,
    "hidden": torch.float32, "old_logprobs": torch.float32, "ref_logprobs": torch.float32,
    "advantages": torch.float32, "anchor_key": torch.int64, "response_versions": torch.int64,
}


def _pad_2d(rows: Sequence[Sequence[float] | torch.Tensor], dtype: torch.dtype, pad: float = 0) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), pad, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.as_tensor(r, dtype=dtype)
    return out


def _pad_width(t: torch.Tensor, width: int, pad: float) -> torch.Tensor:
    if t.shape[1] == width:
        return t
    out = torch.full((t.shape[0], width), pad, dtype=t.dtype, device=t.device)
    out[:, : t.shape[1]] = t
    return out


@dataclasses.dataclass
class StepBatch:
    group_id: torch.Tensor
    traj_id: torch.Tensor
    step: torch.Tensor
    prompt_ids: torch.Tensor
    prompt_lengths: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    env_reward: torch.Tensor
    invalid_penalty: torch.Tensor
    noop_penalty: torch.Tensor
    done: torch.Tensor
    episode_return: torch.Tensor
    success: torch.Tensor
    action_valid: torch.Tensor
    is_expert: torch.Tensor
    policy_version: torch.Tensor
    anchor_obs: list[str]
    action: list[str]
    task_type: list[str]
    hidden: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    anchor_key: torch.Tensor | None = None
    response_versions: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    pad_id: int = 0

    def __post_init__(self) -> None:
        n = self.group_id.shape[0]
        for name in REQUIRED_TENSORS + OPTIONAL_TENSORS:
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"StepBatch.{name} must be a tensor, got {type(value).__name__}")
            if value.shape[0] != n:
                raise ValueError(f"StepBatch.{name} has {value.shape[0]} rows, expected {n}")
        if self.anchor_key is not None and n and int(self.anchor_key.min()) < 0:
            raise ValueError("StepBatch.anchor_key must be >= 0 (each group's observations numbered 0, 1, ...); "
                             "renumber with batch.with_anchor_keys() or pass anchor_key=None")
        for name in STRING_COLUMNS:
            value = getattr(self, name)
            if len(value) != n:
                raise ValueError(f"StepBatch.{name} has {len(value)} rows, expected {n}")
        for name, value in self.extras.items():
            if value.shape[0] != n:
                raise ValueError(f"StepBatch.extras[{name!r}] has {value.shape[0]} rows, expected {n}")
        for a, b in (("response_ids", "response_mask"), ("response_ids", "rollout_logprobs"),
                     ("response_ids", "response_versions")):
            if getattr(self, b) is not None and getattr(self, a).shape != getattr(self, b).shape:
                raise ValueError(f"StepBatch.{a} {tuple(getattr(self, a).shape)} and {b} "
                                 f"{tuple(getattr(self, b).shape)} must have the same shape")

    # ----- construction --------------------------------------------------------------------------
    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], pad_id: int = 0) -> "StepBatch":
        """Build from one dict per step record (Python lists or tensors for the token columns).

        Keys: ``group_id``, ``traj_id``, ``step``, ``prompt_ids``, ``response_ids``,
        ``env_reward``, ``done``, ``success``, ``anchor_obs``; optional: ``invalid_penalty`` and
        ``noop_penalty`` (default 0), ``response_mask`` (default ones over the response),
        ``rollout_logprobs`` (default zeros), ``action_valid`` (default True), ``is_expert``
        (default False), ``policy_version`` (default 0), ``action`` and ``task_type`` (default
        ""), ``episode_return`` (default: the sum of the trajectory's rewards), and
        ``hidden``/``old_logprobs``/``ref_logprobs``/``advantages``/``anchor_key``, taken when
        every record has them. A record may give ``reward`` instead of ``env_reward`` when it has
        no penalties (the two are then equal); giving both is an error.
        """
        records = list(records)
        if not records:
            raise ValueError("StepBatch.from_records needs at least one record")
        col = {key: [r.get(key) for r in records] for key in records[0]}

        def need(key: str) -> list:
            if key not in col or any(v is None for v in col[key]):
                raise KeyError(f"every step record needs the key {key!r}")
            return col[key]

        def optional(key: str, default: Any) -> list:
            return [default if v is None else v for v in col[key]] if key in col else [default] * len(records)

        response = need("response_ids")
        mask = col.get("response_mask") or [[1.0] * len(r) for r in response]
        logprobs = col.get("rollout_logprobs") or [[0.0] * len(r) for r in response]
        if "reward" in col and "env_reward" in col:
            raise KeyError("a step record gives env_reward (and its penalties) or reward, not both")
        env_reward = torch.tensor(need("env_reward" if "env_reward" in col else "reward"), dtype=torch.float32)
        invalid_penalty = torch.tensor(optional("invalid_penalty", 0.0), dtype=torch.float32)
        noop_penalty = torch.tensor(optional("noop_penalty", 0.0), dtype=torch.float32)
        if "reward" in col and bool((invalid_penalty != 0).any() or (noop_penalty != 0).any()):
            raise KeyError("a step record with penalties gives env_reward, not reward")
        rewards = env_reward - invalid_penalty - noop_penalty
        traj = torch.tensor(need("traj_id"), dtype=torch.int64)
        kwargs: dict[str, Any] = dict(
            group_id=torch.tensor(need("group_id"), dtype=torch.int64),
            traj_id=traj,
            step=torch.tensor(need("step"), dtype=torch.int64),
            prompt_ids=_pad_2d(need("prompt_ids"), torch.int64, pad_id),
            prompt_lengths=torch.tensor([len(p) for p in col["prompt_ids"]], dtype=torch.int64),
            response_ids=_pad_2d(response, torch.int64, pad_id),
            response_mask=_pad_2d(mask, torch.float32, 0.0),
            rollout_logprobs=_pad_2d(logprobs, torch.float32, 0.0),
            env_reward=env_reward,
            invalid_penalty=invalid_penalty,
            noop_penalty=noop_penalty,
            done=torch.tensor(need("done"), dtype=torch.bool),
            action_valid=torch.tensor(optional("action_valid", True), dtype=torch.bool),
            is_expert=torch.tensor(optional("is_expert", False), dtype=torch.bool),
            policy_version=torch.tensor(optional("policy_version", 0), dtype=torch.int64),
            anchor_obs=[str(x) for x in need("anchor_obs")],
            action=[str(x) if x is not None else "" for x in col.get("action") or [""] * len(records)],
            task_type=[str(x) if x is not None else "" for x in col.get("task_type") or [""] * len(records)],
            pad_id=pad_id,
        )
        if "episode_return" in col and all(v is not None for v in col["episode_return"]):
            kwargs["episode_return"] = torch.tensor(col["episode_return"], dtype=torch.float32)
        else:
            seg, _ = segment_ids(traj)
            totals = torch.zeros(int(seg.max()) + 1).index_add_(0, seg, rewards)
            kwargs["episode_return"] = totals[seg]
        kwargs["success"] = torch.tensor(need("success"), dtype=torch.bool)
        if "hidden" in col and all(v is not None for v in col["hidden"]):
            kwargs["hidden"] = torch.stack([torch.as_tensor(h, dtype=torch.float32) for h in col["hidden"]])
        for name in ("old_logprobs", "ref_logprobs"):
            if name in col and all(v is not None for v in col[name]):
                kwargs[name] = _pad_width(_pad_2d(col[name], torch.float32), kwargs["response_ids"].shape[1], 0.0)
        if "advantages" in col and all(v is not None for v in col["advantages"]):
            kwargs["advantages"] = torch.tensor(col["advantages"], dtype=torch.float32)
        if "anchor_key" in col and all(v is not None for v in col["anchor_key"]):
            kwargs["anchor_key"] = torch.tensor(col["anchor_key"], dtype=torch.int64)
        if any(v is not None for v in col.get("response_versions", ())):
            versions = [v if v is not None else [version] * len(r) for v, r, version
                        in zip(col["response_versions"], response, kwargs["policy_version"].tolist())]
            kwargs["response_versions"] = _pad_2d(versions, torch.int64, 0)
        return cls(**kwargs)

    # ----- basic properties ----------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.group_id.shape[0])

    @property
    def reward(self) -> torch.Tensor:
        """The step's total reward: ``env_reward - invalid_penalty - noop_penalty``."""
        return self.env_reward - self.invalid_penalty - self.noop_penalty

    @property
    def num_steps(self) -> int:
        return len(self)

    @property
    def num_trajectories(self) -> int:
        return int(torch.unique(self.traj_id).numel())

    @property
    def num_groups(self) -> int:
        return int(torch.unique(self.group_id).numel())

    def _tensor_items(self) -> dict[str, torch.Tensor]:
        out = {n: getattr(self, n) for n in REQUIRED_TENSORS + OPTIONAL_TENSORS if getattr(self, n) is not None}
        out.update({f"extras.{k}": v for k, v in self.extras.items()})
        return out

    def _rebuild(self, tensors: dict[str, torch.Tensor], strings: dict[str, list[str]]) -> "StepBatch":
        extras = {k[len("extras."):]: v for k, v in tensors.items() if k.startswith("extras.")}
        fields = {k: v for k, v in tensors.items() if not k.startswith("extras.")}
        return StepBatch(**fields, **strings, extras=extras, pad_id=self.pad_id)

    # ----- selection, concatenation, devices -----------------------------------------------------
    def select(self, index: torch.Tensor | Sequence[int] | Sequence[bool]) -> "StepBatch":
        """Rows by boolean mask or integer index (order of ``index`` kept)."""
        index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            if index.shape[0] != len(self):
                raise ValueError(f"mask has {index.shape[0]} entries for {len(self)} rows")
            index = index.nonzero(as_tuple=True)[0]
        index = index.to(torch.int64)
        idx_list = index.tolist()
        tensors = {k: v[index.to(v.device)] for k, v in self._tensor_items().items()}
        strings = {k: [getattr(self, k)[i] for i in idx_list] for k in STRING_COLUMNS}
        return self._rebuild(tensors, strings)

    @staticmethod
    def concat(batches: Sequence["StepBatch"]) -> "StepBatch":
        """Row-wise concatenation; token columns are padded to the widest batch.

        ``traj_id`` and ``group_id`` are kept as they are: callers concatenating batches from
        different rollouts must give them disjoint ids (see :meth:`offset_ids`).
        """
        if not batches:
            raise ValueError("StepBatch.concat needs at least one batch")
        if any(b.response_versions is not None for b in batches):
            batches = [b.with_response_versions() for b in batches]
        first = batches[0]
        keys = set(first._tensor_items())
        for b in batches[1:]:
            if set(b._tensor_items()) != keys:
                raise ValueError("cannot concatenate StepBatches with different columns: "
                                 f"{sorted(keys ^ set(b._tensor_items()))}")
            if b.pad_id != first.pad_id:
                raise ValueError("cannot concatenate StepBatches with different pad_id")
        tensors = {}
        for k in keys:
            parts = [b._tensor_items()[k] for b in batches]
            if k in TOKEN_COLUMNS:
                width = max(p.shape[1] for p in parts)
                pad = first.pad_id if k in ("prompt_ids", "response_ids") else 0
                parts = [_pad_width(p, width, pad) for p in parts]
            tensors[k] = torch.cat(parts)
        strings = {k: [s for b in batches for s in getattr(b, k)] for k in STRING_COLUMNS}
        return first._rebuild(tensors, strings)

    def with_anchor_keys(self) -> "StepBatch":
        """A copy whose ``anchor_key`` numbers each group's distinct ``anchor_obs`` in order of first
        appearance (what the rollout engine records), e.g. after editing ``anchor_obs``."""
        return dataclasses.replace(self, anchor_key=torch.tensor(number_in_groups(self.group_id.tolist(),
                                                                                  self.anchor_obs)),
                                   extras=dict(self.extras))

    def with_response_versions(self) -> "StepBatch":
        """A copy whose ``response_versions`` is filled (each token its row's ``policy_version`` where it
        was None), e.g. to concatenate it with a batch that has one."""
        if self.response_versions is not None:
            return self
        versions = self.policy_version.unsqueeze(1).expand(-1, self.response_ids.shape[1]).clone()
        return dataclasses.replace(self, response_versions=versions, extras=dict(self.extras))

    def token_versions(self) -> torch.Tensor:
        """int64 [N, R]: the policy version of every response token (``response_versions``, or each
        row's ``policy_version``)."""
        return self.with_response_versions().response_versions

    def offset_ids(self, traj_offset: int, group_offset: int) -> "StepBatch":
        """A copy with ``traj_id``/``group_id`` shifted (to concatenate independent rollouts)."""
        return dataclasses.replace(self, traj_id=self.traj_id + traj_offset, group_id=self.group_id + group_offset,
                                   extras=dict(self.extras))

    def to(self, device: torch.device | str) -> "StepBatch":
        tensors = {k: v.to(device) for k, v in self._tensor_items().items()}
        return self._rebuild(tensors, {k: list(getattr(self, k)) for k in STRING_COLUMNS})

    def with_columns(self, **columns: Any) -> "StepBatch":
        """A copy with some columns replaced or filled (e.g. ``advantages=...``)."""
        return dataclasses.replace(self, **columns)

    # ----- grouping ------------------------------------------------------------------------------
    def group_segments(self) -> tuple[torch.Tensor, int]:
        """``group_id`` mapped to contiguous ids ``0..G-1`` (order of first appearance sorted by id)."""
        return segment_ids(self.group_id)

    def trajectory_segments(self) -> tuple[torch.Tensor, int]:
        return segment_ids(self.traj_id)

    def trajectory_rows(self) -> torch.Tensor:
        """Index of one row per trajectory (its last step), sorted by trajectory segment id."""
        seg, count = self.trajectory_segments()
        order = torch.argsort(seg * (int(self.step.max()) + 1 if len(self) else 1) + self.step)
        last = torch.zeros(count, dtype=torch.int64)
        last[seg[order]] = order  # later rows (higher step) overwrite earlier ones
        return last

    # ----- disk ----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``tensors.safetensors`` + ``strings.json`` into directory ``path`` (atomically)."""
        from safetensors.torch import save_file

        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file({k: _compact(k, v.detach().cpu()).contiguous() for k, v in self._tensor_items().items()},
                  str(tmp / "tensors.safetensors"))
        meta = {k: getattr(self, k) for k in STRING_COLUMNS}
        meta["pad_id"] = self.pad_id
        (tmp / "strings.json").write_text(json.dumps(meta))
        if path.exists():
            for f in path.iterdir():
                f.unlink()
            path.rmdir()
        tmp.rename(path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "StepBatch":
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / "tensors.safetensors").is_file():
            raise FileNotFoundError(f"{path} is not a saved StepBatch (no tensors.safetensors)")
        tensors = {k: v.to(_DTYPES[k]) if k in _DTYPES else v
                   for k, v in load_file(str(path / "tensors.safetensors")).items()}
        meta = json.loads((path / "strings.json").read_text())
        pad_id = int(meta.pop("pad_id", 0))
        extras = {k[len("extras."):]: v for k, v in tensors.items() if k.startswith("extras.")}
        fields = {k: v for k, v in tensors.items() if not k.startswith("extras.")}
        return cls(**fields, **{k: meta[k] for k in STRING_COLUMNS}, extras=extras, pad_id=pad_id)


def _compact(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Token ids on disk as int32 when they fit (half the size of a saved batch's largest columns);
    :meth:`StepBatch.load` restores the contract's dtypes."""
    if name in ("prompt_ids", "response_ids") and tensor.dtype == torch.int64 and tensor.numel() \
            and int(tensor.min()) >= -2 ** 31 and int(tensor.max()) < 2 ** 31:
        return tensor.to(torch.int32)
    return tensor


def number_in_groups(groups: Sequence[int], values: Sequence[str]) -> list[int]:
    """For each row, the index of its value among its group's distinct values (first appearance first)."""
    seen: dict[int, dict[str, int]] = {}
    out = []
    for g, v in zip(groups, values):
        table = seen.setdefault(g, {})
        out.append(table.setdefault(v, len(table)))
    return out


def segment_ids(keys: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary integer keys to contiguous segment ids ``0..S-1`` (sorted by key)."""
    uniq, inverse = torch.unique(keys, sorted=True, return_inverse=True)
    return inverse, int(uniq.numel())


__all__ = ["StepBatch", "number_in_groups", "segment_ids", "REQUIRED_TENSORS", "OPTIONAL_TENSORS", "STRING_COLUMNS"]
