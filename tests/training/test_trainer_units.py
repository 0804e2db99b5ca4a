"""The training loop's small parts: config -> estimator, the task schedule, run dirs."""

import dataclasses

import pytest

from agentrl.config import load_config
from agentrl.config.modes import training_mode
from agentrl.errors import UsageError
from agentrl.estimators import estimator_class, estimator_from_config, registered_names
from agentrl.runs.directory import RunDirectory, TrainerState
from agentrl.runs.task_schedule import TaskSchedule
from agentrl.training.metrics import rollout_logprob_gap
from agentrl.training.trainer import checkpoint_due, guided_advantages, rows_to_train


@pytest.mark.parametrize("estimator", registered_names())
def test_config_exposes_every_estimator_parameter(estimator):
    """Every Params field is a config key: shared ones at algorithm.<key>, own ones at algorithm.<name>."""
    cls = estimator_class(estimator)
    overrides = [f"algorithm.estimator={estimator}", "algorithm.epsilon=0.001"]
    own = [f for f in dataclasses.fields(cls.Params) if not f.metadata.get("shared")]
    for f in own:
        if f.type in ("bool", bool):
            overrides.append(f"algorithm.{estimator}.{f.name}={str(not f.default).lower()}")
    params = estimator_from_config(load_config("alfworld_gigpo_qwen7b", overrides).algorithm).params
    assert {f.name for f in dataclasses.fields(params)} == {f.name for f in dataclasses.fields(cls.Params)}
    if "epsilon" in {f.name for f in dataclasses.fields(params)}:
        assert params.epsilon == 0.001
    for f in own:
        if f.type in ("bool", bool):
            assert getattr(params, f.name) is (not f.default), f.name


def test_estimator_params_follow_the_recipe():
    params = estimator_from_config(load_config("webshop_bipace_qwen1.5b").algorithm).params
    assert (params.eps, params.mode, params.gamma) == (0.05, "mean_norm", 0.95)


def test_task_schedule_is_deterministic_and_walks_whole_epochs():
    a, b = TaskSchedule("train", 10, 4, seed=3), TaskSchedule("train", 10, 4, seed=3)
    assert [a.tasks_for(i) for i in range(1, 6)] == [b.tasks_for(i) for i in range(1, 6)]
    first_epoch = [t.index for i in (1, 2) for t in a.tasks_for(i)] + [t.index for t in a.tasks_for(3)[:2]]
    assert sorted(first_epoch) == list(range(10))
    assert TaskSchedule("train", 10, 4, seed=4).tasks_for(1) != a.tasks_for(1)


def test_run_directory_refuses_an_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = load_config(None, [f"trainer.output_dir={blocker}"])
    with pytest.raises(UsageError, match="cannot write to the run directory"):
        RunDirectory.create(cfg, "textcraft_grpo_tiny")


def test_trainer_state_round_trip_and_resume_errors(tmp_path):
    state = TrainerState(iteration=3, model_dir="/m", estimator_state={"eps": 0.1, "calibration": {}})
    assert TrainerState.from_json(state.to_json()) == state
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", f"trainer.resume={tmp_path / 'nowhere'}"])
    run = RunDirectory.create(cfg, "x")
    with pytest.raises(UsageError, match="no trainer_state.json"):
        run.load_latest()


@pytest.mark.parametrize("overrides, saved", [
    ([], [2, 4, 5]),                                                  # every 2, and the last
    (["trainer.final_checkpoint=false"], [2, 4]),                     # not the last
    (["trainer.save_every=0"], [5]),
    (["trainer.save_every=0", "trainer.final_checkpoint=false"], []),   # the smoke runs: none at all
    (["trainer.iterations=4", "trainer.final_checkpoint=false"], [2]),  # not even when save_every divides it
])
def test_checkpoints_are_written_every_save_every_and_at_the_end_unless_switched_off(overrides, saved):
    cfg = load_config(None, ["trainer.iterations=5", "trainer.save_every=2", *overrides])
    assert [k for k in range(1, cfg.trainer.iterations + 1) if checkpoint_due(k, cfg.trainer)] == saved


def test_rows_to_train_drops_only_zero_advantage_rows_when_asked():
    import torch

    from agentrl.data import StepBatch

    records = [dict(group_id=i // 2, traj_id=i, step=0, done=True, success=bool(i % 2), env_reward=float(i % 2),
                    prompt_ids=[5, 6], response_ids=[7], response_mask=[1.0], anchor_obs=f"o{i}") for i in range(4)]
    batch = StepBatch.from_records(records, pad_id=0).with_columns(advantages=torch.tensor([0.0, 1.5, -0.0, -2.0]))
    same, share = rows_to_train(batch, False)
    assert same is batch and share == 1.0
    kept, share = rows_to_train(batch, True)
    assert kept.traj_id.tolist() == [1, 3] and kept.advantages.tolist() == [1.5, -2.0] and share == 0.5
    assert len(rows_to_train(batch.select(torch.zeros(4, dtype=torch.bool)), True)[0]) == 0


def test_guided_groups_keep_their_failed_samples_at_zero_unless_negatives_are_asked_for():
    import torch

    from agentrl.data import StepBatch

    # group 0: two sampled failures and the expert's episode (traj 9); group 1: a mixed group, not guided
    traj = [0, 1, 9, 2, 3]
    records = [dict(group_id=int(t == 2 or t == 3), traj_id=t, step=0, done=True, success=t in (3, 9),
                    is_expert=t == 9, env_reward=0.0, prompt_ids=[5], response_ids=[7], response_mask=[1.0],
                    anchor_obs="o") for t in traj]
    batch = StepBatch.from_records(records, pad_id=0)
    adv = torch.tensor([-3.3, -3.3, 6.7, -5.0, 5.0])
    kept = guided_advantages(batch, adv)
    assert kept.tolist() == pytest.approx([0.0, 0.0, 6.7, -5.0, 5.0])
    unguided = batch.with_columns(is_expert=torch.zeros(5, dtype=torch.bool))
    assert torch.equal(guided_advantages(unguided, adv), adv)          # no expert episode: nothing changes


def test_rollout_logprob_gap_counts_only_sampled_response_tokens():
    import torch

    from agentrl.data import StepBatch

    # row 0: sampled, second token masked out; row 1: the expert's (guided) step, rollout log-probs 0
    records = [dict(group_id=0, traj_id=t, step=0, done=True, success=False, env_reward=0.0, prompt_ids=[5],
                    response_ids=[7, 8], response_mask=mask, rollout_logprobs=[-1.0, -2.0], anchor_obs="o",
                    is_expert=t == 1) for t, mask in ((0, [1.0, 0.0]), (1, [1.0, 1.0]))]
    batch = StepBatch.from_records(records, pad_id=0)
    assert rollout_logprob_gap(batch) == {}                       # no learner pass yet
    scored = batch.with_columns(old_logprobs=torch.tensor([[-1.25, -9.0], [-7.0, -7.0]]))
    assert rollout_logprob_gap(scored) == {"learner/rollout_logprob_gap_mean": 0.25,
                                           "learner/rollout_logprob_gap_max": 0.25}
    assert rollout_logprob_gap(scored.select(torch.tensor([False, True]))) == {}    # guided rows only


def test_phases_time_each_phase_and_take_the_gpu_memory_peak_of_each():
    import time

    from agentrl.runs.tracking import GpuMemory, Phases

    readings = iter([1, 5, 3, 9, 2, 2, 2])      # bytes in use, as mem_get_info would report them
    last = [0]

    def used():
        last[0] = next(readings, last[0])
        return last[0]

    memory = GpuMemory(used, interval_s=3600.0)  # sampled only as phases open and close here
    try:
        phase = Phases(memory, always=("learner_pass",))
        with phase("rollout"):      # samples 1 and 5
            time.sleep(0.01)
        with phase("update"):       # 3 and 9
            pass
        with phase("update"):       # 2 and 2: a second run of a phase adds its seconds
            pass
        metrics = phase.metrics()
    finally:
        memory.close()
    assert metrics["time/learner_pass_s"] == 0.0 and metrics["time/rollout_s"] >= 0.01
    assert metrics["time/iteration_s"] == pytest.approx(metrics["time/rollout_s"] + metrics["time/update_s"])
    assert metrics["memory/rollout_peak_gb"] == 5e-9 and metrics["memory/update_peak_gb"] == 9e-9
    assert memory.take() == {}          # taken: the next iteration starts afresh
    assert GpuMemory.for_device("cpu") is None


@pytest.mark.parametrize("wanted, device, stage, learner_gpus, rollout_gpus, path", [
    ("auto", "cpu", 2, [], [], "packed"),
    ("auto", "cuda", 2, ["a"], ["a", "a"], "ipc"),               # colocated: nothing leaves the GPU
    ("auto", "cuda", 2, ["a", "b"], ["a", "b"], "ipc"),          # per rank: each engine GPU holds a learner rank
    ("auto", "cuda", 2, ["a"], ["a", "b"], "packed"),            # rank 0 shares a GPU with an engine: no NCCL
    ("auto", "cuda", 2, ["a", "b"], ["c", "d"], "broadcast"),    # split
    ("auto", "cuda", 2, ["a", "b"], ["b", "c"], "broadcast"),    # rank 1 is no member of the broadcast group
    ("auto", "cuda", 3, ["a", "b"], ["a", "b"], "packed"),       # ZeRO-3 gathers one parameter at a time
    ("auto", "cuda", 3, ["a"], ["b"], "broadcast"),
    ("broadcast", "cpu", 2, [], [], "broadcast"),                # gloo on CPU
    ("packed", "cuda", 2, ["a"], ["a"], "packed"),
    ("ipc", "cuda", 2, ["a", "b"], ["b"], "ipc"),
])
def test_the_weight_sync_path(wanted, device, stage, learner_gpus, rollout_gpus, path):
    from agentrl.training.weight_sync import weight_sync_path

    cfg = load_config("textcraft_grpo_tiny", [f"rollout.weight_sync={wanted}", f"learner.num_ranks={len(learner_gpus) or 1}",
                                              f"learner.zero_stage={stage}"])
    assert weight_sync_path(cfg, device, learner_gpus, rollout_gpus) == path


def test_no_broadcast_between_two_processes_on_one_gpu():
    """NCCL refuses a group with two members on one GPU: the colocated layout, or an engine on the GPU
    of the learner's rank 0, never broadcasts (auto takes ipc or packed; asking for it is refused)."""
    from agentrl.training.weight_sync import weight_sync_path

    zero3 = load_config("textcraft_grpo_tiny", ["learner.num_ranks=4", "learner.zero_stage=3"])
    gpus = ["a", "b", "c", "d"]
    assert weight_sync_path(zero3, "cuda", gpus, gpus, colocated=True) == "packed"
    assert weight_sync_path(zero3, "cuda", gpus, ["e", "f"]) == "broadcast"
    one_rank = load_config("textcraft_grpo_tiny", [])
    assert weight_sync_path(one_rank, "cuda", ["a"], ["a"], colocated=True) == "ipc"
    for layout in ({"colocated": True}, {}):
        asked = load_config("textcraft_grpo_tiny", ["learner.num_ranks=4", "rollout.weight_sync=broadcast"])
        with pytest.raises(UsageError, match="NCCL refuses two members on one GPU"):
            weight_sync_path(asked, "cuda", gpus, ["a", "e"], **layout)


def test_ipc_weight_sync_where_it_cannot_apply_is_a_usage_error():
    from agentrl.training.weight_sync import weight_sync_path

    cfg = load_config("textcraft_grpo_tiny", ["rollout.weight_sync=ipc"])
    with pytest.raises(UsageError, match="rollout.weight_sync=ipc needs the learner on GPUs"):
        weight_sync_path(cfg, "cpu", [], [])
    with pytest.raises(UsageError, match="every rollout GPU holding a learner rank"):
        weight_sync_path(cfg, "cuda", ["a"], ["a", "b"])


def test_a_push_frees_the_learners_cached_gpu_memory_before_the_engines_wake():
    """Colocated (or IPC): the learner's cached CUDA blocks go back to the device before the engines on
    its GPUs wake to load the weights; a split layout keeps its cache."""
    from agentrl.training.weight_sync import weight_sync_for

    calls = []

    class Learner:
        def gpu_uuids(self): return ["a", "b"]
        def free_cached_memory(self): calls.append("free")
        def weights_call(self, sender, method, *args): calls.append(method); return [[]]   # rank 0: no bucket

    class Rollout:
        def __init__(self, gpus): self.gpus = gpus
        def gpu_uuids(self): return self.gpus
        def weights_call(self, receiver, method, *buckets, version): calls.append(f"{method} {version}"); return []
        def wait(self, started): pass

    zero3 = load_config("textcraft_grpo_tiny", ["learner.num_ranks=2", "learner.zero_stage=3"])
    colocated = weight_sync_for(zero3, Learner(), Rollout(["a", "b"]), "cuda", colocated=True)
    colocated.push(4)
    assert colocated.name == "packed" and calls == ["free", "pack", "load 4"]
    calls.clear()
    split = weight_sync_for(zero3, Learner(), Rollout(["c", "d"]), "cuda")
    assert split.name == "broadcast" and not split.free_learner_cache
    packed_split = weight_sync_for(load_config("textcraft_grpo_tiny", ["rollout.weight_sync=packed"]), Learner(),
                                   Rollout(["c"]), "cuda")
    packed_split.push(5)
    assert calls == ["pack", "load 5"]


@pytest.mark.parametrize("overrides, cap", [
    ([], 0.0),                                                      # sync: the learner's own policy sampled
    (["trainer.mode=one_step_off"], 2.0),                           # ahead of the learner: corrected by default
    (["trainer.mode=async"], 2.0),
    (["trainer.mode=async", "learner.rollout_is_cap=3"], 3.0),
    (["trainer.mode=async", "learner.rollout_is_cap=0"], 0.0),      # asked for: uncorrected (with a warning)
])
def test_the_off_policy_correction_is_on_by_default_when_the_rollout_runs_ahead(overrides, cap):
    from agentrl.learner.losses import LossSettings

    cfg = load_config("textcraft_grpo_tiny", overrides)
    assert LossSettings.from_config(cfg.learner, rollout_runs_ahead=training_mode(cfg.trainer.mode).overlapped).rollout_is_cap == cap


def test_an_uncorrected_overlapped_run_says_so(capsys):
    from agentrl.training.modes import warn_if_uncorrected

    warn_if_uncorrected(load_config("textcraft_grpo_tiny", ["trainer.mode=async"]))
    assert capsys.readouterr().err == ""
    warn_if_uncorrected(load_config("textcraft_grpo_tiny", ["trainer.mode=async", "learner.rollout_is_cap=0"]))
    assert "has no off-policy correction" in capsys.readouterr().err


@pytest.mark.parametrize("overrides, message", [
    (["trainer.mode=async", "learner.recompute_logprobs=false"], "centres the PPO clip on the rollout's policy, up to 2"),
    (["trainer.mode=one_step_off", "learner.recompute_logprobs=false"], "up to 1 version"),
    (["trainer.filter_groups=true"], "trainer.filter_groups works on the group stream of trainer.mode=async"),
    (["trainer.mode=one_step_off", "trainer.oversample=1.5"], "trainer.oversample works on the group stream"),
])
def test_settings_that_contradict_the_training_mode_are_refused(overrides, message):
    with pytest.raises(UsageError, match=message):
        load_config("textcraft_grpo_tiny", overrides)


@pytest.mark.parametrize("device, reserved", [("cuda", True), ("cpu", False)])
def test_a_gpu_run_reserves_its_placement_before_anything_starts(tmp_path, monkeypatch, device, reserved):
    """On GPUs the plan's placement group comes first: a refusal there leaves no policy built and no
    actor started; a CPU run makes no plan at all."""
    import agentrl.training.trainer as trainer_module
    from agentrl.placement import InfeasiblePlan
    from agentrl.training.trainer import Trainer

    cfg = load_config("alfworld_bipace_qwen7b", [f"trainer.output_dir={tmp_path}", "logging.tensorboard=false",
                                                 "logging.progress_bar=false", "logging.wandb.mode=disabled"])
    calls = []

    def refuse(cfg, log):
        calls.append("reserve")
        raise InfeasiblePlan("the split layout needs 8 GPUs", "add GPUs")

    class Stop(Exception):
        pass

    def build(self, model_dir):
        calls.append("build")
        raise Stop

    monkeypatch.setattr(trainer_module, "reserve_for_run", refuse)     # the name the trainer calls
    monkeypatch.setattr(Trainer, "learner_device", lambda self: device)
    monkeypatch.setattr(Trainer, "prepare_policy", lambda self: calls.append("policy") or str(tmp_path))
    monkeypatch.setattr(Trainer, "build", build)
    trainer = Trainer(cfg, "unit")
    try:
        with pytest.raises(InfeasiblePlan if reserved else Stop):
            trainer.train()
    finally:
        trainer.close()
    assert calls == (["reserve"] if reserved else ["policy", "build"])
