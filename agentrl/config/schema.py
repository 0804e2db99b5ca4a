"""Typed configuration: every field with its default, its help text and what it accepts.

The tree (``Config``) is built from the dataclass defaults, then the recipe's YAML files, then
``key=value`` overrides (see :mod:`agentrl.config.loading`). Three sections are generated from
declarations that live with the code that reads them: ``algorithm`` from the estimators' ``Params``
(agentrl.estimators), the back ends' sections of ``rollout`` (``rollout.vllm``) from their ``Settings``
(agentrl.generation), the policy losses' sections of ``learner`` (``learner.<loss>``) from their ``Params``
(agentrl.policy_losses, assembled in agentrl.config.learner_section) and the warm-start techniques' sections of ``trainer.sft`` (``trainer.sft.dagger``
...) from agentrl.config.sft_options. Field metadata:

``help``     one line shown by ``agentrl config --keys`` and in docs/configuration.md
``choices``  the accepted values (strings)
``min``/``max`` inclusive numeric bounds; ``gt`` an exclusive lower bound
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from agentrl.config.modes import mode_help
from agentrl.config.sft_options import TECHNIQUES
from agentrl.estimators import SharedParams, builtin_estimators
from agentrl.estimators.params import own_fields
from agentrl.generation import auto_backend, builtin_backends
from agentrl.config.learner_section import LearnerConfig


def F(default: Any = None, help: str = "", *, factory: Any = None, **checks: Any) -> Any:
    """A dataclass field with help text and validation metadata."""
    meta = {"help": help, **checks}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# ----------------------------------------------------------------------------------------- model
@dataclass
class TinyModelConfig:
    hidden_size: int = F(256, "hidden size of the tiny Qwen2 model", min=16)
    num_layers: int = F(4, "decoder layers", min=1)
    num_heads: int = F(4, "attention heads", min=1)
    num_kv_heads: int = F(2, "key/value heads (grouped-query attention)", min=1)
    intermediate_size: int = F(768, "MLP inner size", min=16)
    max_position_embeddings: int = F(2048, "longest sequence the model supports", min=64)
    rope_theta: float = F(10000.0, "RoPE base frequency", gt=0)
    tie_word_embeddings: bool = F(True, "share input and output embeddings")


@dataclass
class ModelConfig:
    name_or_path: str = F("tiny", "`tiny` (built from model.tiny and a tokenizer trained on env text), "
                          "a local Hugging Face model directory, or a hub name such as Qwen/Qwen2.5-7B-Instruct")
    random_init: bool = F(False, "build the named architecture with random weights instead of loading them "
                          "(shape tests and GPU smoke runs without checkpoints), in the dtype its checkpoints are "
                          "stored in (bf16 for Qwen2.5)")
    dtype: str = F("auto", "parameter dtype: auto = bfloat16 on GPU, float32 on CPU",
                   choices=("auto", "float32", "bfloat16", "float16"))
    attn_implementation: str = F("sdpa", "attention kernel passed to transformers",
                                 choices=("sdpa", "eager", "flash_attention_2"))
    gradient_checkpointing: bool = F(False, "recompute activations in the backward pass to save memory")
    lora_rank: int = F(0, "LoRA rank; 0 trains all weights", min=0)
    lora_alpha: int = F(16, "LoRA alpha", min=1)
    trust_remote_code: bool = F(False, "allow model code from the checkpoint directory")
    tiny: TinyModelConfig = F(help="sizes of the tiny CPU model", factory=TinyModelConfig)


@dataclass
class TokenizerConfig:
    name_or_path: Optional[str] = F(None, "tokenizer directory or hub name; null = the model's")
    vocab_size: int = F(2048, "vocabulary size when the tokenizer is trained on env text", min=64)
    corpus_tasks: int = F(200, "expert episodes per environment used as tokenizer training text", min=1)


# ------------------------------------------------------------------------------------------- env
@dataclass
class EnvConfig:
    name: str = F("textcraft", "environment: the name of one found (an installed agentrl-env-<name> distribution, or "
                  "envs/<name>/ of a source checkout; `agentrl envs list`), or package.module:SPEC / "
                  "package.module:make_env for one of your own (docs/environments.md, 'Add an environment')")
    max_steps: int = F(40, "episode step limit (ALFWorld 50, WebShop 15, TextCraft 40 in the papers)", min=1)
    group_size: int = F(8, "rollouts per task (G): the group compared with each other", min=1)
    tasks_per_iteration: int = F(16, "distinct tasks per training iteration", min=1)
    train_split: str = F("train", "split that training tasks are drawn from")
    eval_split: str = F("test", "split used for periodic validation")
    history_length: int = F(2, "previous observation/action pairs shown in the prompt", min=0)
    history_count_repeats: bool = F(False, "show a run of consecutive steps with the same action and the same "
                                    "result as one history entry with its count (history_length then counts "
                                    "entries): with TextCraft's one-batch crafts the prompt says how many "
                                    "were made")
    reward: str = F("success", "step reward: success = success_reward when the episode is won (verl-agent), "
                    "env = the environment's own reward", choices=("success", "env"))
    success_reward: float = F(10.0, "reward at the winning step when env.reward=success", gt=0)
    server_url: Optional[str] = F(None, "`agentrl envs serve` servers to use instead of starting env pool actors in "
                                  "the Ray cluster: http://host:port, several separated by commas (each may end in "
                                  "max=N: use at most N of its instances), or @file listing one per line; with "
                                  "several, instances are spread over them and moved off a server that dies "
                                  "(docs/env-servers.md, 'Several env servers')")
    server_token_file: Optional[str] = F(None, "file holding the shared token of the env.server_url servers (read "
                                         "where each rollout worker runs, into that process only; refused when "
                                         "others may read it: chmod 600); unset: $AGENTRL_ENV_TOKEN if set, "
                                         "else no token (docs/env-servers.md, 'Authentication and TLS')")
    num_servers: int = F(1, "env pool server processes (the env steps of one iteration are spread over them)", min=1)
    step_timeout_s: float = F(60.0, "per-call timeout for env reset/step batches", gt=0)
    reset_timeout_s: float = F(10.0, "extra seconds a reset batch may take per instance one env server resets "
                               "(servers reset their instances one by one; ALFWorld loads a game in 1-3 s)", min=0)
    kwargs: dict = F(help="extra keyword arguments for the environment factory", factory=dict)


# --------------------------------------------------------------------------------------- rollout
def _backend_help() -> str:
    return (f"generation back end: auto (the installed back end that prefers the device: "
            f"{auto_backend('cuda', installed_only=False).name} on GPU, {auto_backend('cpu', installed_only=False).name} "
            f"on CPU), {', '.join(builtin_backends())}, or a class of one's own by import path "
            "package.module:ClassName (docs/rollout.md, 'Add a back end')")


@dataclass
class RolloutGeneralSettings:
    """``rollout``'s own keys; the back ends' sections are added by :func:`_rollout_config_class`."""

    backend: str = F("auto", _backend_help())
    num_workers: int = F(1, "Ray rollout workers; the envs of an iteration are split among them", min=1)
    torch_threads: int = F(0, "CPU threads of each rollout worker's torch backend; 0 = the machine's cores divided "
                           "by rollout.num_workers (the env servers wait while the policy generates, so the "
                           "workers may use every core then); with trainer.mode one_step_off or async the "
                           "learner runs at the same time and takes one share too", min=0)
    temperature: float = F(1.0, "sampling temperature for training rollouts; the learner computes every "
                           "log-prob (old, reference, updated) and the entropy under softmax(logits / T) "
                           "with the same T", min=0)
    top_p: float = F(1.0, "nucleus sampling", gt=0, max=1)
    top_k: int = F(-1, "top-k sampling; -1 disables", min=-1)
    max_prompt_tokens: int = F(2048, "prompt length limit", min=16)
    max_response_tokens: int = F(512, "generated tokens per step", min=1)
    prompt_truncation: str = F("error", "what to do with a longer prompt: error, or keep its last tokens",
                               choices=("error", "left"))
    invalid_action_penalty: float = F(0.1, "charged to a step whose response has no valid action (the StepBatch's "
                                      "invalid_penalty column; algorithm.penalty_mode says where it enters)", min=0)
    noop_penalty: float = F(0.0, "charged to a step (the StepBatch's noop_penalty column, an ordinary reward) when "
                            "the environment reports that a well-formed "
                            "action changed nothing (info['noop']: ALFWorld's 'Nothing happens.', TextCraft's "
                            "'Could not ...'); 0 = off, as in the reference framework", min=0)
    enable_thinking: bool = F(True, "ask for <think>...</think> before <action>...</action> (and require it)")
    show_admissible: bool = F(True, "list the admissible actions in the prompt (TextCraft's original protocol "
                              "has none: its recipe list is in the task)")
    prompt_style: str = F("full", "full = the reference framework's prompt wording; compact = same content, "
                          "fewer words (tiny models); compact_task_last = compact with the task line after the "
                          "observation, next to the answer (a tiny model copies the goal's object from there)",
                          choices=("full", "compact", "compact_task_last"))
    on_env_failure: str = F("rerun", "an episode ended by an environment failure (instance raised or hung, "
                            "env server process died or did not answer): rerun = play it "
                            "again from reset; mask = drop its steps, its group's statistics use the others",
                            choices=("rerun", "mask"))
    weight_sync: str = F("auto", "how new weights reach the rollout workers: ipc = CUDA IPC handles of the learner's "
                         "tensors, no copy leaves the GPU (one learner rank with ZeRO <= 2 and every rollout worker on "
                         "its GPU); broadcast = a process group of the learner's rank 0 and the workers, NCCL on GPUs "
                         "(gloo on CPU); packed = flat byte buckets through host memory and Ray's object store; auto = "
                         "ipc where it applies, else broadcast on GPUs (packed with placement.layout=colocated, "
                         "where NCCL cannot join two processes on one GPU), else packed; or a weight path of your "
                         "own by import path (agentrl.weights.WeightPath)")
    weights_between_tokens: bool = F(True, "weights that reach a rollout worker during a generate call (trainer.mode="
                                     "async) are loaded between two tokens and the response finishes on them, each "
                                     "token's version recorded (StepBatch.response_versions); backends that generate "
                                     "in one call (vLLM) load them at the next env step, as does false")
    expert_guidance: bool = F(False, "training rollouts only: add one episode played by the env's expert solver "
                              "to every group whose episodes all failed, so the group has a winner (off-policy "
                              "guidance; its steps are scored and updated like the policy's own and are left out "
                              "of the episode metrics; the group's failed sampled episodes keep advantage 0, as "
                              "without guidance)")
    agent: Optional[str] = F(None, "an agent written outside agentrl that plays the episodes through an "
                             "OpenAI-compatible gateway (module:function, docs/agents.md); every model call is one "
                             "step; None = agentrl's own agent loop")
    agent_processes: int = F(0, "rollout.agent: play the episodes in this many processes per rollout worker "
                             "(their environment stepped through the gateway) instead of threads of the worker, "
                             "which share its interpreter lock with the engine; 0 = threads", min=0)
    agent_timeout_s: float = F(600.0, "an agent episode (rollout.agent) that has not returned after this long fails "
                               "(re-run or masked as rollout.on_env_failure says)", gt=0)
    max_env_failures: int = F(16, "failed episodes one rollout call tolerates; one more stops the run with a "
                              "checkpoint of the last iteration whose update the learner holds and a one-line error", min=0)
    hang_timeout_s: float = F(600.0, "a rollout worker that makes no progress (no generate call, env step or reset "
                              "finished) for this long stops the run with a checkpoint of the last iteration "
                              "whose update the learner holds and a one-line report: which worker, on which node, doing what, with "
                              "which env instances; 0 = wait forever", min=0)


def _rollout_config_class() -> type:
    """``rollout``: the general keys (``rollout.<key>``), one section per built-in back end that declares
    settings (``rollout.<name>.<key>``, its ``Settings`` dataclass) and ``rollout.backend_params`` for one
    loaded by import path, generated from the back ends' declarations (agentrl.generation)."""
    hints = typing.get_type_hints(RolloutGeneralSettings)
    general = dataclasses.fields(RolloutGeneralSettings)
    fields: list[tuple[str, Any, Any]] = [
        (f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                   metadata=f.metadata)) for f in general]
    for name, backend in builtin_backends().items():
        if backend.Settings is None:
            continue
        if name in {f.name for f in general} | {"backend_params"}:
            raise ValueError(f"the {name} back end's settings would hide the key rollout.{name}: rename the back end")
        fields.append((name, backend.Settings, F(help=f"{backend.title or name} engine settings",
                                                 factory=backend.Settings)))
    fields.append(("backend_params", dict, F(help="the settings of a back end loaded by import path "
                                                   "(rollout.backend=package.module:ClassName), checked against its "
                                                   "Settings; built-in back ends read rollout.<name>", factory=dict)))
    return dataclasses.make_dataclass("RolloutConfig", fields, namespace={"__module__": __name__})


RolloutConfig = _rollout_config_class()


# ------------------------------------------------------------------------------------- algorithm
def _section_class(estimator: type) -> type:
    """``algorithm.<name>``: the estimator's own parameters, with their defaults, help and checks."""
    hints = typing.get_type_hints(estimator.Params)
    fields = [(f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                         metadata=f.metadata))
              for f in own_fields(estimator.Params)]
    cls = dataclasses.make_dataclass(f"{estimator.__name__}Section", fields, namespace={"__module__": __name__})
    globals()[cls.__name__] = cls      # importable by name: a config pickles into Ray actors
    return cls


def _algorithm_config_class() -> type:
    """``algorithm``: the estimator, the shared keys (``algorithm.<key>``), one section per built-in
    estimator (``algorithm.<name>.<key>``) and ``algorithm.params`` for one loaded by import path,
    all generated from the estimators' declarations (agentrl.estimators)."""

    names = ", ".join(builtin_estimators())
    fields: list[tuple[str, Any, Any]] = [
        ("estimator", str, F("grpo", f"advantage estimator: {names}, or a user's class by import path "
                                     "package.module:ClassName (docs/estimators.md)"))]
    hints = typing.get_type_hints(SharedParams)
    fields += [(f.name, hints[f.name], dataclasses.field(default=f.default, metadata=f.metadata))
               for f in dataclasses.fields(SharedParams)]
    for name, estimator in builtin_estimators().items():
        section = _section_class(estimator)
        fields.append((name, section, F(help=f"{estimator.title or name} options", factory=section)))
    fields.append(("params", dict, F(help="the parameters of an estimator loaded by import path "
                                          "(algorithm.estimator=package.module:ClassName), checked against its "
                                          "Params; built-in estimators read algorithm.<name>", factory=dict)))
    return dataclasses.make_dataclass("AlgorithmConfig", fields, namespace={"__module__": __name__})


AlgorithmConfig = _algorithm_config_class()


# --------------------------------------------------------------------------------------- learner
# LearnerConfig: agentrl/config/learner_section.py (its policy-loss sections are generated)


# ------------------------------------------------------------------------------------ sft / trainer
@dataclass
class SftGeneralSettings:
    """``trainer.sft``'s own keys; the warm-start techniques' sections are added by :func:`_sft_config_class`."""

    enabled: str = F("auto", "auto = warm-start tiny models when no checkpoint is given", choices=("auto", "yes", "no"))
    tasks: int = F(400, "training tasks whose expert demonstrations are used", min=1)
    epochs: float = F(3.0, "passes over the demonstrations", gt=0)
    lr: float = F(1e-3, "SFT learning rate", gt=0)
    batch_size: int = F(32, "(prompt, action) pairs per optimizer step", min=1)
    split: Optional[str] = F(None, "split whose expert demonstrations SFT and the tokenizer corpus use; null = "
                             "env.train_split (set it to warm-start on one split and run RL on another, e.g. RL on "
                             "pool_depth2_wide after SFT on pool_depth2)")
    demonstration_workers: int = F(1, "processes that play the expert episodes for SFT and the tokenizer corpus "
                                   "(ALFWorld loads each game in ~0.6-3 s; the demonstrations do not depend on it)",
                                   min=1)
    max_minutes: float = F(0.0, "stop SFT after this many minutes; 0 = no limit (a time bound makes the warm start "
                           "depend on the machine's load)", min=0)
    cache_dir: str = F("", "reuse warm starts across runs: a directory holding one finished SFT model per set of "
                       "settings it depends on (model, tokenizer, env, prompt, SFT settings, seed; not the "
                       "estimator or RL settings); only step-bounded SFT (max_minutes = 0) is cached; '' = off")


def _sft_config_class() -> type:
    """``trainer.sft``: the general keys (``trainer.sft.<key>``) and one section per warm-start technique
    (``trainer.sft.<technique>.<key>``), generated from the techniques' declarations
    (agentrl.config.sft_options); a section's type is the technique's own options dataclass."""

    hints = typing.get_type_hints(SftGeneralSettings)
    fields: list[tuple[str, Any, Any]] = [
        (f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                   metadata=f.metadata))
        for f in dataclasses.fields(SftGeneralSettings)]
    fields += [(name, options, F(help=options.title, factory=options)) for name, options in TECHNIQUES.items()]
    return dataclasses.make_dataclass("SftConfig", fields, namespace={"__module__": __name__})


SftConfig = _sft_config_class()


@dataclass
class TrainerConfig:
    iterations: int = F(150, "training iterations (each: tasks_per_iteration x group_size episodes)", min=0)
    seed: int = F(0, "global seed (task order, sampling, initialisation)")
    output_dir: str = F("runs", "directory that holds one subdirectory per run")
    run_name: Optional[str] = F(None, "run subdirectory name; null = <recipe>-seed<seed>")
    eval_every: int = F(5, "validate every N iterations; 0 disables", min=0)
    eval_before_train: bool = F(True, "validate once before the first iteration")
    save_every: int = F(10, "checkpoint every N iterations; 0 = only at the end (trainer.final_checkpoint)", min=0)
    keep_checkpoints: int = F(2, "newest checkpoints kept on disk", min=1)
    final_checkpoint: bool = F(True, "when the last iteration ends, write its checkpoint and export final_model; "
                               "false = neither (smoke runs and benchmarks that want only the metrics: a 1.5B "
                               "checkpoint with optimizer state is ~21 GB); checkpoints of earlier iterations "
                               "(trainer.save_every) are still written")
    resume: str = F("auto", "auto = continue the run in output_dir if it has a checkpoint; never; or a path")
    init_checkpoint: Optional[str] = F(None, "start from this checkpoint or model directory (skips SFT)")
    device: str = F("auto", "auto = cuda when available, else cpu", choices=("auto", "cpu", "cuda"))
    mode: str = F("sync", mode_help())
    max_staleness: int = F(2, "trainer.mode=async: a group is trained at most this many policy versions after the "
                           "oldest version that generated one of its steps; older groups are dropped and counted. "
                           "Also how many iterations' groups the stream runs ahead of the learner", min=1)
    filter_groups: bool = F(False, "trainer.mode=async: leave out groups whose episode returns are all equal (no "
                            "signal for a group-relative estimator; DAPO's dynamic sampling); the stream plays more "
                            "groups in their place, so every update still has env.tasks_per_iteration groups")
    oversample: float = F(1.0, "trainer.mode=async: keep this many times the groups the staleness bound allows in "
                          "flight (e.g. 1.25 with trainer.filter_groups, so filtered groups are replaced without "
                          "waiting; groups that then exceed max_staleness are dropped)", min=1)
    sft: SftConfig = F(help="supervised warm start on expert demonstrations", factory=SftConfig)


@dataclass
class WandbConfig:
    mode: str = F("auto", "auto = online with WANDB_API_KEY, else offline", choices=("auto", "online", "offline", "disabled"))
    project: str = F("agentrl", "wandb project")
    entity: Optional[str] = F(None, "wandb entity (team)")


@dataclass
class LoggingConfig:
    tensorboard: bool = F(True, "write TensorBoard event files")
    progress_bar: bool = F(True, "progress lines on stderr: the warm start's SFT phases and steps, then iteration, success rate and phase times")
    save_batches: int = F(0, "every N iterations, save that iteration's StepBatch with its transcript (decoded "
                          "responses, episodes) to <run>/batches/ for `agentrl inspect`, with the hidden states an "
                          "estimator of the registry reads (sizes in docs/evaluation.md); 0 = off", min=0)
    wandb: WandbConfig = F(help="Weights & Biases tracking", factory=WandbConfig)


@dataclass
class EvalConfig:
    split: Optional[str] = F(None, "split to evaluate; null = env.eval_split")
    num_tasks: int = F(0, "tasks evaluated; 0 = the whole split", min=0)
    temperature: float = F(0.4, "sampling temperature at validation (0 = greedy)", min=0)
    seeds: list = F(help="sampling seeds; one evaluation pass per seed", factory=lambda: [0])
    chunk_size: int = F(64, "`agentrl eval`: tasks per rollout call; each finished chunk is appended to "
                        "episodes.jsonl (what a killed evaluation can lose)", min=1)
    record_transcripts: bool = F(True, "`agentrl eval`: keep every episode's observations, responses and "
                                 "actions in episodes.jsonl")


@dataclass
class PlacementConfig:
    layout: str = F("auto", "how learner ranks and rollout engines share the GPUs (docs/multinode.md): split = "
                    "each GPU holds one learner rank or one GPU of a rollout engine; colocated = each GPU holds a "
                    "learner rank and one GPU of an engine (learner.num_ranks = rollout.num_workers x "
                    "tensor_parallel_size; set rollout.vllm.sleep_level so the engine frees its memory for the "
                    "learner); auto = split when it fits the GPUs and their memory, else colocated",
                    choices=("auto", "split", "colocated"))
    nodes: int = F(0, "nodes of the cluster to plan for (`agentrl plan`; `agentrl train` refuses a plan that does "
                   "not fit them before anything starts); 0 = the Ray cluster's own when training", min=0)
    gpus_per_node: int = F(0, "GPUs of each node to plan for; 0 = the Ray cluster's own when training", min=0)
    gpu_memory_gb: float = F(80.0, "memory of one GPU (10^9 bytes) that the plan's estimates must fit: 80 for "
                             "A100/H100 80GB (a margin: they hold 85.9), 141 for H200, 40 for A100 40GB", gt=0)
    wait_s: float = F(300.0, "GPU training: how long the Ray cluster may take to grant the plan's placement "
                      "group (all of its bundles at once) before the run stops with one line naming what the "
                      "cluster lacks", gt=0)
    learner: list = F(help="Ray custom resources (e.g. node_a, set by `ray start --resources`) that place the "
                      "learner ranks, one per rank and repeated when shorter; [] = where Ray finds room. Only for "
                      "learner.num_ranks > 1 (one rank runs in the agentrl process)", factory=list)
    rollout: list = F(help="Ray custom resources that place the rollout workers, one per worker, repeated when "
                      "shorter; [] = where Ray finds room", factory=list)
    env: list = F(help="Ray custom resources that place the env pool shards (env.num_servers), one per shard, "
                  "repeated when shorter; [] = where Ray finds room", factory=list)


@dataclass
class Config:
    description: str = F("", "one line shown by `agentrl recipes`")
    model: ModelConfig = F(help="the policy model", factory=ModelConfig)
    tokenizer: TokenizerConfig = F(help="the tokenizer", factory=TokenizerConfig)
    env: EnvConfig = F(help="the environment and the shape of an iteration", factory=EnvConfig)
    rollout: RolloutConfig = F(help="multi-turn generation", factory=RolloutConfig)
    algorithm: AlgorithmConfig = F(help="advantage estimation", factory=AlgorithmConfig)
    learner: LearnerConfig = F(help="policy optimisation", factory=LearnerConfig)
    trainer: TrainerConfig = F(help="the training loop", factory=TrainerConfig)
    logging: LoggingConfig = F(help="metrics and trackers", factory=LoggingConfig)
    eval: EvalConfig = F(help="validation and evaluation", factory=EvalConfig)
    placement: PlacementConfig = F(help="how the roles share the GPUs and nodes: the placement plan, its Ray "
                                        "placement group and custom-resource pinning (docs/multinode.md)",
                                   factory=PlacementConfig)
