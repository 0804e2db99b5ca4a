"""`agentrl plan` prints the plan (text and JSON) without a GPU or Ray; `agentrl train` refuses a plan
that does not fit placement.nodes x placement.gpus_per_node before it writes anything."""

from __future__ import annotations

import json

from agentrl.cli.main import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_plan_of_the_7b_recipe_on_one_node_of_eight(capsys):
    code, out, err = run(capsys, "plan", "recipe=alfworld_bipace_qwen7b", "placement.nodes=1",
                         "placement.gpus_per_node=8")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "alfworld_bipace_qwen7b on 1 node x 8 GPUs of 80 GB: split layout, 8 of 8 GPUs used"
    assert "  GPU 0  learner rank 0                               51.4 GB" in lines
    assert "  GPU 7  rollout engine 0 [4/4]                       48.0 GB" in lines
    assert any(line.startswith("  learner rank: weights 3.8 + grads 3.8 + AdamW 22.8 + CUDA 1.0 = 31.5 resident")
               for line in lines)
    assert lines[-1] == ("Ray placement group (one, all bundles at once): 4 x {GPU: 1, CPU: 1} learner ranks; "
                         "1 x {GPU: 4, CPU: 1} rollout engine; 1 x {CPU: 1} env server = 8 GPUs, 6 CPUs")


def test_four_nodes_show_the_unused_ones_and_flags_may_follow_the_overrides(capsys):
    code, out, _ = run(capsys, "plan", "recipe=alfworld_bipace_qwen7b", "placement.nodes=4",
                       "placement.gpus_per_node=8", "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["layout"], data["gpus_used"], data["gpus_unused"]) == ("split", 8, 24)
    assert [e["gpus"] for e in data["engines"]] == [[4, 5, 6, 7]]
    assert data["bundles"][4] == {"role": "rollout", "index": 0, "resources": {"GPU": 4, "CPU": 1.0}}
    code, out, _ = run(capsys, "plan", "recipe=alfworld_bipace_qwen7b", "placement.nodes=4",
                       "placement.gpus_per_node=8")
    assert "node 3: 8 GPUs unused" in out.splitlines()
    assert "note: 24 of 32 GPUs unused: raise learner.num_ranks or rollout.num_workers to use them" in out


def test_an_infeasible_plan_is_one_error_line(capsys):
    code, out, err = run(capsys, "plan", "recipe=alfworld_bipace_qwen7b", "placement.nodes=2",
                         "placement.gpus_per_node=2")
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "agentrl: error: a rollout engine of rollout.vllm.tensor_parallel_size=4 needs 4 GPUs on one node and the "
        "nodes have at most 2 (2 nodes x 2 GPUs); set rollout.vllm.tensor_parallel_size to 2 or less (and "
        "rollout.num_workers up to keep the GPUs busy)"]
    code, _, err = run(capsys, "plan", "recipe=alfworld_bipace_qwen7b")
    assert code == 2 and "pass placement.nodes=N and placement.gpus_per_node=G" in err


def test_train_refuses_a_plan_that_does_not_fit_before_writing_anything(capsys, tmp_path):
    code, out, err = run(capsys, "train", "recipe=alfworld_bipace_qwen7b", "trainer.device=cuda",
                         "placement.nodes=1", "placement.gpus_per_node=4", f"trainer.output_dir={tmp_path / 'runs'}")
    assert code == 2
    assert err.splitlines() == [
        "agentrl: error: the split layout needs 8 GPUs (4 learner rank(s) + 1 rollout engine(s) x 4) and the cluster "
        "has 4 (1 node x 4 GPUs); add GPUs (placement.nodes), lower learner.num_ranks or rollout.num_workers, or set "
        "placement.layout=colocated"]
    assert not (tmp_path / "runs").exists()
