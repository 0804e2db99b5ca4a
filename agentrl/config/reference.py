"""The configuration reference (docs/configuration.md), generated from the config dataclasses
(with the sections they generate from the estimators', the policy losses' and the warm-start techniques'
declarations).

``python -m agentrl.config.reference > docs/configuration.md`` rewrites it; a test fails when the
committed file differs from what the dataclasses say.
"""

from __future__ import annotations

import dataclasses
import typing

from agentrl.config.schema import Config
from agentrl.envs.spec import env_names, env_spec
from agentrl.estimators.params import describe


def _default(f: dataclasses.Field) -> object:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def _accepted(f: dataclasses.Field, typ: object) -> str:
    if "choices" in f.metadata:
        return " \\| ".join(f"`{c}`" for c in f.metadata["choices"])
    return describe(dict(f.metadata), typ)


def _section(cls: type, prefix: str, lines: list[str]) -> None:
    hints = typing.get_type_hints(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            nested.append((f, hints[f.name]))
            continue
        rows.append(f"| `{prefix}{f.name}` | `{_default(f)!r}` | {_accepted(f, hints[f.name])} | {f.metadata['help']} |")
    if rows:
        lines += [f"## `{prefix.rstrip('.') or 'top level'}`", "", "| key | default | accepts | meaning |",
                  "|---|---|---|---|", *rows, ""]
    for f, typ in nested:
        _section(typ, f"{prefix}{f.name}.", lines)


MACHINE_SWITCHES = """## Machine-specific switches

Settings that depend on the machine a run is on, not on the experiment: they change speed or where
files go, never the numbers a recipe produces (except where a line says so).

| switch | default | what it does |
|---|---|---|
| `rollout.torch_threads` | `0` = the cores this process may use, divided by `rollout.num_workers` (by `rollout.num_workers + 1` with `trainer.mode` one_step_off or async) | CPU threads of each torch rollout worker |
| `learner.torch_threads` | `0` = torch's default (the cores); one share with `trainer.mode` one_step_off or async | CPU threads of the one-rank learner in the agentrl process |
| `OMP_NUM_THREADS` | torch's default (the cores) | CPU threads of the agentrl process itself (the one-rank learner, the estimators; the BiGPO hidden-state clustering spreads its groups over them) |
| `AGENTRL_KEEP_DENORMALS=1` | off: denormal floats are flushed to zero in every agentrl process | keep IEEE gradual underflow (bit-for-bit comparisons with other code); a trained model's CPU update then runs ~1.5x slower (agentrl/runtime/denormals.py) |
| `AGENTRL_NATIVE=0` | on where a C compiler exists | the BiGPO hidden-state clustering without its compiled kernel (numpy; the same labels, 2-3x slower) |
| `CC` | `cc`, then `gcc` | the compiler that builds that kernel on first use |
| `AGENTRL_BIGPO_BF16=0` / `=1` | `auto`: on where the CPU has AVX512-BF16 or AMX and the accumulation check passes | the kernel's bfloat16 screen (the same labels; docs/estimators.md) |
| `AGENTRL_CACHE_DIR` | `$XDG_CACHE_HOME/agentrl` or `~/.cache/agentrl` | where the compiled kernel and environments' generated data are kept |
{env_switches}| `learner.cpu_shm_comm` | `false` | multi-rank CPU learners: DeepSpeed's shared-memory all-reduce (a ~40 s JIT build) instead of gloo |
| `learner.precision`, `model.dtype` | `auto`: bf16 on GPU, fp32 on CPU | the numeric format (a recipe's numbers depend on it) |
| `trainer.device` | `auto`: cuda when visible | where the learner runs |
| `RAY_ADDRESS` | unset: a local Ray cluster | join a running Ray cluster (docs/multinode.md) |
"""


def _env_switches() -> list[tuple[str, str, str]]:
    """The switches the environments found declare (``EnvSpec.switches``), by environment name."""
    return [row for name in sorted(env_names()) for row in env_spec(name).switches]


def render() -> str:
    lines = ["# Configuration reference", "",
             "Generated from `agentrl/config/schema.py`, the estimators' `Params` (`agentrl/estimators/`), the policy",
             "losses' `Params` (`agentrl/policy_losses/`) and the warm-start techniques' options (`agentrl/config/sft_options.py`) by `python -m agentrl.config.reference`;",
             "do not edit by hand.",
             "Recipes (`recipes/`, installed as `agentrl/recipes/`) override these defaults and `key=value` arguments override recipes, e.g.",
             "`agentrl train recipe=alfworld_gigpo_qwen1.5b learner.lr=2e-6 env.group_size=4`.", ""]
    _section(Config, "", lines)
    lines.append(MACHINE_SWITCHES.replace("{env_switches}", "".join(
        f"| `{switch}` | {default} | {what} |\n" for switch, default, what in _env_switches())))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
