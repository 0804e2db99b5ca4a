"""The placement plan without Ray or a GPU: the shipped 7B and 1.5B recipes on 1x8, 2x8 and 4x8 GPUs,
split and colocated, the bundles Ray is asked for, the refusals (one line each) and one memory
estimate checked by hand."""

from __future__ import annotations

import json

import pytest

from agentrl.config import load_config
from agentrl.errors import UsageError
from agentrl.models.shapes import known_shape
from agentrl.placement import InfeasiblePlan, plan_placement
from agentrl.placement.memory import model_shape
from agentrl.placement.reservation import plan_bundles, requested

SEVEN_B = "alfworld_bipace_qwen7b"
ONE_HALF_B = "alfworld_bipace_qwen1.5b"
SHAPES = [(1, 8), (2, 8), (4, 8)]


def cfg_of(recipe: str, *overrides: str):
    return load_config(recipe, list(overrides))


def check_invariants(plan) -> None:
    """No GPU used twice by one role, each engine's GPUs on one node, split GPUs hold one role."""
    seen = set()
    for engine in plan.engines:
        assert len(engine.gpus) == plan.tensor_parallel_size == len(set(engine.gpus))
        for gpu in engine.gpus:
            assert (engine.node, gpu) not in seen
            seen.add((engine.node, gpu))
    ranks = {(r.node, r.gpu) for r in plan.ranks}
    assert len(ranks) == len(plan.ranks)
    if plan.layout == "split":
        assert not ranks & seen
    else:
        assert ranks == seen


@pytest.mark.parametrize("nodes, gpus", SHAPES)
def test_the_shipped_7b_recipe_is_split_over_one_node_of_eight(nodes, gpus):
    plan = plan_placement(cfg_of(SEVEN_B), nodes, gpus)
    check_invariants(plan)
    assert plan.layout == "split" and not plan.learner_in_driver
    assert [(r.rank, r.node, r.gpu) for r in plan.ranks] == [(r, 0, r) for r in range(4)]
    assert [(e.node, e.gpus) for e in plan.engines] == [(0, (4, 5, 6, 7))]
    assert plan.gpus_used == 8 and len(plan.unused) == nodes * gpus - 8
    assert [u.role for u in plan.gpu(0, 4).uses] == ["rollout"]
    if nodes > 1:
        assert plan.notes == [f"{nodes * gpus - 8} of {nodes * gpus} GPUs unused: raise learner.num_ranks or "
                              "rollout.num_workers to use them"]
    bundles = plan_bundles(plan, cfg_of(SEVEN_B))
    assert [(b.role, b.resources) for b in bundles] == [("learner", {"GPU": 1, "CPU": 1.0})] * 4 + [
        ("rollout", {"GPU": 4, "CPU": 1.0}), ("env", {"CPU": 1.0})]


@pytest.mark.parametrize("nodes, gpus", SHAPES)
def test_the_shipped_1_5b_recipe_takes_four_gpus(nodes, gpus):
    plan = plan_placement(cfg_of(ONE_HALF_B), nodes, gpus)
    check_invariants(plan)
    assert plan.layout == "split"
    assert [(r.node, r.gpu) for r in plan.ranks] == [(0, 0), (0, 1)]
    assert [(e.node, e.gpus) for e in plan.engines] == [(0, (2, 3))]
    assert plan.gpus_used == 4


def test_the_7b_recipe_scaled_to_four_nodes_fills_them_with_each_engine_on_one_node():
    plan = plan_placement(cfg_of(SEVEN_B, "learner.num_ranks=16", "rollout.num_workers=4"), 4, 8)
    check_invariants(plan)
    assert plan.gpus_used == 32 and not plan.unused and not plan.notes
    assert [(e.node, e.gpus) for e in plan.engines] == [(0, (0, 1, 2, 3)), (0, (4, 5, 6, 7)),
                                                        (1, (0, 1, 2, 3)), (1, (4, 5, 6, 7))]
    assert {r.node for r in plan.ranks} == {2, 3}


def test_on_two_nodes_of_eight_the_engines_fill_the_first_and_the_learner_the_second():
    plan = plan_placement(cfg_of(SEVEN_B, "learner.num_ranks=8", "rollout.num_workers=2"), 2, 8)
    check_invariants(plan)
    assert [(e.node, e.gpus) for e in plan.engines] == [(0, (0, 1, 2, 3)), (0, (4, 5, 6, 7))]
    assert [(r.node, r.gpu) for r in plan.ranks] == [(1, gpu) for gpu in range(8)]


@pytest.mark.parametrize("nodes, gpus", SHAPES)
def test_colocated_7b_puts_a_rank_and_an_engine_gpu_on_each_of_four_gpus(nodes, gpus):
    cfg = cfg_of(SEVEN_B, "placement.layout=colocated", "rollout.vllm.sleep_level=1",
                 "rollout.vllm.gpu_memory_utilization=0.4")
    plan = plan_placement(cfg, nodes, gpus)
    check_invariants(plan)
    assert plan.layout == "colocated" and plan.gpus_used == 4
    for r in range(4):
        assert [(u.role, u.index, u.part) for u in plan.gpu(0, r).uses] == [("learner", r, 0), ("rollout", 0, r)]
    assert [(b.role, b.resources) for b in plan_bundles(plan, cfg)] == [
        ("colocated", {"GPU": 4, "CPU": 5.0}), ("env", {"CPU": 1.0})]
    # the busier phase: the learner resident (31.46) with vLLM awake (0.4 x 80 = 32)
    assert plan.gpu(0, 0).memory_gb == pytest.approx(31.462 + 32.0, abs=0.01)


def test_a_one_rank_learner_is_the_drivers_gpu_pinned_to_its_node():
    cfg = cfg_of(ONE_HALF_B, "learner.num_ranks=1")
    plan = plan_placement(cfg, 2, 8)
    assert plan.learner_in_driver and [(r.node, r.gpu) for r in plan.ranks] == [(0, 0)]
    assert [(e.node, e.gpus) for e in plan.engines] == [(0, (1, 2))]
    bundles = plan_bundles(plan, cfg, "node:10.0.0.1")
    assert [(b.role, b.resources) for b in bundles][:2] == [("driver", {"GPU": 1, "node:10.0.0.1": 0.001}),
                                                            ("rollout", {"GPU": 2, "CPU": 1.0})]
    colocated = cfg_of(ONE_HALF_B, "learner.num_ranks=1", "rollout.vllm.tensor_parallel_size=1",
                       "placement.layout=colocated", "rollout.vllm.sleep_level=1")
    plan = plan_placement(colocated, 1, 8)
    assert [(u.role, u.index) for u in plan.gpu(0, 0).uses] == [("learner", 0), ("rollout", 0)]
    assert plan_bundles(plan, colocated, "node:10.0.0.1")[0].resources == {"GPU": 1, "CPU": 1.0,
                                                                           "node:10.0.0.1": 0.001}


def test_placement_resources_go_into_the_bundles():
    cfg = cfg_of(SEVEN_B, "placement.learner=[node_a]", "placement.rollout=[node_b]", "placement.env=[cpu_a,cpu_b]",
                 "env.num_servers=2")
    bundles = plan_bundles(plan_placement(cfg, 2, 8), cfg)
    assert bundles[0].resources == {"GPU": 1, "CPU": 1.0, "node_a": 0.001}
    assert bundles[4].resources == {"GPU": 4, "CPU": 1.0, "node_b": 0.001}
    assert [b.resources for b in bundles[5:]] == [{"CPU": 1.0, "cpu_a": 0.001}, {"CPU": 1.0, "cpu_b": 0.001}]
    assert requested(bundles)["GPU"] == 8 and requested(bundles)["CPU"] == 7


def test_auto_takes_colocated_when_split_needs_more_gpus_than_there_are():
    cfg = cfg_of(ONE_HALF_B, "placement.layout=auto", "rollout.vllm.sleep_level=1",
                 "rollout.vllm.gpu_memory_utilization=0.3")
    plan = plan_placement(cfg, 1, 2)
    assert plan.layout == "colocated"
    assert plan.notes[0].startswith("placement.layout=auto chose colocated: split does not fit (the split layout "
                                    "needs 4 GPUs")
    assert plan_placement(cfg, 1, 8).layout == "split"


REFUSALS = [
    ((SEVEN_B,), dict(nodes=1, gpus_per_node=4),
     "the split layout needs 8 GPUs (4 learner rank(s) + 1 rollout engine(s) x 4) and the cluster has 4 (1 node x 4 "
     "GPUs); add GPUs (placement.nodes), lower learner.num_ranks or rollout.num_workers, or set "
     "placement.layout=colocated"),
    ((SEVEN_B,), dict(nodes=4, gpus_per_node=2),
     "a rollout engine of rollout.vllm.tensor_parallel_size=4 needs 4 GPUs on one node and the nodes have at most 2 "
     "(4 nodes x 2 GPUs); set rollout.vllm.tensor_parallel_size to 2 or less (and rollout.num_workers up to keep "
     "the GPUs busy)"),
    ((SEVEN_B, "placement.layout=colocated", "learner.num_ranks=6"), dict(nodes=1, gpus_per_node=8),
     "the colocated layout puts one learner rank on each GPU of each rollout engine, so learner.num_ranks must equal "
     "rollout.num_workers x rollout.vllm.tensor_parallel_size (6 != 1 x 4); set learner.num_ranks=4, or "
     "placement.layout=split"),
    ((SEVEN_B, "learner.num_ranks=1", "rollout.num_workers=3"), dict(node_gpus=(6, 6, 1)),
     "rollout engine 2 needs 4 free GPUs on one node and no node has them (free GPUs per node: 1, 2, 1); lower "
     "rollout.vllm.tensor_parallel_size or rollout.num_workers, or add nodes"),
    ((SEVEN_B, "learner.micro_batch_size=64"), dict(nodes=1, gpus_per_node=8),
     "a learner rank needs an estimated 94.2 GB of its GPU"),
    ((SEVEN_B, "placement.layout=colocated"), dict(nodes=1, gpus_per_node=8),
     "a GPU shared by a learner rank and a rollout engine needs an estimated 99.4 GB"),
    ((SEVEN_B, "rollout.vllm.gpu_memory_utilization=0.05"), dict(nodes=1, gpus_per_node=8),
     "rollout.vllm.gpu_memory_utilization=0.05 gives vLLM 4.0 GB of each engine GPU (of placement.gpu_memory_gb=80), "
     "less than its 3.8 GB share of the weights plus 1 GB of KV cache; raise rollout.vllm.gpu_memory_utilization or "
     "rollout.vllm.tensor_parallel_size"),
]


@pytest.mark.parametrize("config, shape, message", REFUSALS)
def test_an_infeasible_plan_is_refused_in_one_line_naming_the_fix(config, shape, message):
    with pytest.raises(InfeasiblePlan) as refused:
        plan_placement(cfg_of(*config), **shape)
    text = str(refused.value)
    assert "\n" not in text and text.startswith(message), text
    assert isinstance(refused.value, UsageError)


def test_auto_names_both_layouts_when_neither_fits():
    with pytest.raises(InfeasiblePlan, match=r"^neither layout fits: split: the split layout needs 8 GPUs .*; "
                                             r"colocated: a GPU shared by a learner rank .*; add GPUs"):
        plan_placement(cfg_of(SEVEN_B, "placement.layout=auto"), 1, 4)


def test_a_plan_needs_the_clusters_shape_and_a_gpu_for_the_drivers_learner():
    with pytest.raises(UsageError, match="pass placement.nodes=N and placement.gpus_per_node=G"):
        plan_placement(cfg_of(SEVEN_B))
    with pytest.raises(InfeasiblePlan, match="learner.num_ranks=1 runs the learner in the agentrl process, on node 0 "
                                             r"\(the driver's\), which has no GPU"):
        plan_placement(cfg_of(ONE_HALF_B, "learner.num_ranks=1"), node_gpus=(0, 8))


def test_parameter_counts_match_the_published_sizes():
    assert known_shape("Qwen/Qwen2.5-7B-Instruct").parameters() == 7_615_616_512      # "7.61B"
    assert known_shape("Qwen/Qwen2.5-1.5B-Instruct").parameters() == 1_543_714_304    # "1.54B"
    assert known_shape("Qwen/Qwen2.5-0.5B-Instruct").parameters() == 494_032_768      # "0.49B"


def test_the_7b_learner_estimate_by_hand():
    plan = plan_placement(cfg_of(SEVEN_B), 1, 8)
    learner, rollout = plan.learner, plan.rollout
    p = 7_615_616_512
    assert learner.weights == pytest.approx(2 * p / 4 / 1e9)           # bf16, ZeRO-3 over 4 ranks: 3.81
    assert learner.grads == pytest.approx(2 * p / 4 / 1e9)
    assert learner.optimizer == pytest.approx(12 * p / 4 / 1e9)        # fp32 master + 2 moments: 22.85
    assert learner.reference == 0 and learner.reference_pass == pytest.approx(2 * p / 1e9)   # offload_ref: 15.23
    tokens = 8 * (2048 + 512)                                           # micro-batch 8 at the length bounds
    one_layer = tokens * 2 * (8 * 3584 + 3 * 18944)
    checkpoints = 28 * tokens * 2 * 3584
    logits = 1024 * 152064 * 4         # learner.logprob_chunk_tokens of the 8 x 512 response positions at a time
    assert learner.activations == pytest.approx((checkpoints + one_layer + 3 * logits) / 1e9)      # 9.48
    assert learner.pass_activations == pytest.approx((one_layer + 2 * logits) / 1e9)               # 4.75
    assert learner.peak == pytest.approx(31.462 + 15.231 + 4.748, abs=0.005)                       # 51.44
    assert plan.gpu(0, 0).memory_gb == learner.peak
    assert rollout.budget == pytest.approx(48.0) and rollout.weights == pytest.approx(2 * p / 4 / 1e9)
    assert plan.gpu(0, 7).memory_gb == pytest.approx(48.0)


def test_the_torch_backend_holds_the_whole_model_and_never_sleeps():
    cfg = cfg_of(SEVEN_B, "rollout.backend=torch", "learner.num_ranks=1", "learner.zero_stage=2",
                 "model.lora_rank=64", "rollout.vllm.tensor_parallel_size=1", "placement.layout=colocated")
    plan = plan_placement(cfg, 1, 1)
    weights = 2 * 7_615_616_512 / 1e9
    assert plan.rollout.budget == pytest.approx(1.25 * weights) and plan.rollout.asleep == plan.rollout.budget
    assert plan.learner.optimizer < 2 and plan.learner.reference_pass == 0        # LoRA: 161 M trained, no reference
    assert plan.gpu(0, 0).memory_gb == pytest.approx(plan.learner.peak + 1.25 * weights)


def test_shapes_of_tiny_models_and_local_directories(tmp_path):
    tiny = model_shape(cfg_of("textcraft_grpo_tiny"))
    assert (tiny.hidden_size, tiny.num_layers, tiny.vocab_size) == (128, 4, 2048)
    (tmp_path / "config.json").write_text(json.dumps(dict(hidden_size=64, intermediate_size=128,
                                                          num_hidden_layers=2, num_attention_heads=4,
                                                          num_key_value_heads=2, vocab_size=100)))
    shape = model_shape(cfg_of("textcraft_grpo_tiny", f"model.name_or_path={tmp_path}"))
    assert shape.parameters() == 2 * 100 * 64 + 2 * shape.layer_parameters() + 64
    unknown = plan_placement(cfg_of(SEVEN_B, "model.name_or_path=nobody/no-such-model"), 1, 8)
    assert unknown.gpu(0, 0).memory_gb is None and unknown.notes[0].startswith("memory not estimated")
