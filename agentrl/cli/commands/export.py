"""``agentrl export checkpoint=DIR out=DIR [recipe=NAME ...]``: a checkpoint as a Hugging Face model."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.errors import UsageError

HELP = "write a training checkpoint's policy as a Hugging Face model directory"
TORCH_COMPUTE = True    # see agentrl.cli.main
DESCRIPTION = ("Load checkpoints/iter_N (or a run directory: its newest checkpoint) and write the policy, with its "
               "tokenizer, to out=DIR, loadable by AutoModelForCausalLM.from_pretrained and by vLLM.")


def add_arguments(parser) -> None:
    parser.add_argument("args", nargs="*", metavar="checkpoint=DIR|out=DIR|key=value",
                        help="checkpoint=DIR (required), out=DIR (required), then config overrides if needed")


def _checkpoint_dir(path: Path) -> Path:
    if (path / "checkpoints" / "latest").is_file():
        return path / "checkpoints" / (path / "checkpoints" / "latest").read_text().strip()
    if (path / "trainer_state.json").is_file():
        return path
    raise UsageError(f"{path} is neither a run directory with checkpoints nor a checkpoints/iter_N directory")


def run(args) -> int:
    options = dict(a.split("=", 1) for a in args.args if a.split("=", 1)[0] in ("checkpoint", "out"))
    rest = [a for a in args.args if a.split("=", 1)[0] not in ("checkpoint", "out")]
    if "checkpoint" not in options or "out" not in options:
        raise UsageError("export needs checkpoint=DIR and out=DIR")
    # absolute: the learner ranks (Ray actors) run in the directory of their node's `ray start`
    ckpt = _checkpoint_dir(Path(options["checkpoint"]).expanduser().absolute())
    out = str(Path(options["out"]).expanduser().absolute())
    run_dir = ckpt.parent.parent
    from agentrl.config import load_config
    from agentrl.runs.directory import TrainerState

    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise UsageError(f"{run_dir} has no config.yaml; export needs the run's configuration")
    # the learner is rebuilt as it was trained (same ranks): ZeRO checkpoints are partitioned per rank
    cfg = load_config(str(config_file), rest)
    state = TrainerState.from_json((ckpt / "trainer_state.json").read_text())
    from agentrl.learner.group import LearnerGroup

    learner = LearnerGroup(cfg, state.model_dir, shared_directory=str(run_dir))
    try:
        learner.load_checkpoint(str(ckpt / "learner"))
        learner.export_hf(out)
    finally:
        learner.shutdown()
    print(json.dumps({"checkpoint": str(ckpt), "iteration": state.iteration, "out": options["out"]}))
    return 0
