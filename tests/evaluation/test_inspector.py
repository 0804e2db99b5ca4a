"""agentrl inspect: the page of a saved batch, as a file (every estimator's column, the step groups,
self-contained) and as a person sees it in headless Chromium (Debian's chromium package) after a
real tiny run that saved its batches."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.config import config_to_dict, load_config
from agentrl.data import StepBatch
from agentrl.errors import UsageError
from agentrl.estimators import registered_names
from agentrl.evaluation.inspector import inspect_run, load_saved, save_batch, saved_iterations

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.num_heads=4", "model.tiny.num_kv_heads=2", "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def hand_made_run(tmp_path: Path) -> Path:
    """A run directory holding one saved batch: one group, two trajectories through states A, B, C,
    with one-hot hidden states (BiPACE's clusters are then exactly the observations)."""
    one_hot = {"A": [1.0, 0.0, 0.0], "B": [0.0, 1.0, 0.0], "C": [0.0, 0.0, 1.0]}
    rows = [(0, 0, "A", 0.0, "go b", True), (0, 1, "B", 10.0, "craft", True),
            (1, 0, "A", 0.0, "go c", True), (1, 1, "C", 0.0, "", False), (1, 2, "B", 0.0, "wait", True)]
    records = [dict(group_id=0, traj_id=t, step=s, prompt_ids=[1, 2], response_ids=[5, 6], env_reward=r,
                    invalid_penalty=0.0 if v else 0.1, done=(t, s) in ((0, 1), (1, 2)), success=t == 0,
                    anchor_obs=f"You are at {o}.", action=a, action_valid=v, task_type="depth2", hidden=one_hot[o])
               for t, s, o, r, a, v in rows]
    batch = StepBatch.from_records(records).with_anchor_keys()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(load_config(
        "textcraft_bipace_tiny", ["algorithm.bipace.eps=0.0", "algorithm.mode=mean_norm"]))))
    save_batch(run, 3, batch, [f"<action>{a}</action>" for *_, a, _ in rows],
               [{"traj_id": t, "group_id": 0, "task": {"split": "train", "index": 7}, "won": t == 0} for t in (0, 1)],
               {"estimator": "bipace"})
    return run


def test_the_page_shows_every_estimator_and_its_step_groups(tmp_path):
    run = hand_made_run(tmp_path)
    assert saved_iterations(run) == [3]
    page = inspect_run(run).read_text()
    assert page.startswith("<!doctype html>") and "inspect_iter_000003" not in page
    # every built-in estimator has a column, computed here on the saved batch
    header = re.search(r"<table class=\"steps\"><thead>(.*?)</thead>", page, re.S).group(1)
    for title in ("GRPO", "RLOO", "REINFORCE++-baseline", "GiGPO", "GAGPO", "BiPACE"):
        assert f">{title}</th>" in header, title
    assert len(registered_names()) == header.count('class="adv"')
    assert page.count('<tr class="step') == 5 and "You are at C." in page and "&lt;action&gt;go b&lt;/action&gt;" in page
    # BiPACE at eps 0 with one-hot states clusters by observation: A, B and C, the two A steps together
    bipace = header[:header.index(">BiPACE</th>")].count('class="adv"') - 1
    clusters = re.findall(rf'data-est="{bipace}" data-cluster="([^"]+)"', page)
    assert len(clusters) == 5 and len(set(clusters)) == 3 and clusters[0] == clusters[2]
    # self-contained: nothing is fetched from anywhere
    assert not re.search(r"(src|href)=\"?(https?:)?//", page)
    # the summary: GiGPO's anchor groups, 3 of them, one of 5 rows alone
    assert re.search(r"<tr><td>GiGPO</td><td>[0-9.]+</td><td>[0-9.]+%</td><td>3</td><td>20.0%</td>", page)


def test_a_batch_without_hidden_states_says_so_and_the_rest_still_runs(tmp_path):
    run = hand_made_run(tmp_path)
    saved = load_saved(run)
    save_batch(run, 3, saved.batch.with_columns(hidden=None), saved.transcript["responses"],
               saved.transcript["episodes"], {"estimator": "bipace"})
    page = inspect_run(run, estimators=["grpo", "bipace"]).read_text()
    assert "needs the actor&#x27;s hidden states" in page and ">GRPO</th>" in page and "BiPACE (n/a)" in page


def test_missing_batches_and_iterations_are_one_line_errors(tmp_path):
    run = hand_made_run(tmp_path)
    with pytest.raises(UsageError, match=r"no saved batch of iteration 9; saved: 3"):
        inspect_run(run, iteration=9)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("{}")
    with pytest.raises(UsageError, match="logging.save_batches"):
        inspect_run(empty)
    with pytest.raises(UsageError, match="not a run directory"):
        inspect_run(tmp_path / "nothing")


def run_cli(args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(RAY_USAGE_STATS_ENABLED="0", WANDB_SILENT="true", OMP_NUM_THREADS="1", **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "agentrl.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, ray_head):
    """A real tiny BiPACE run of 2 iterations from a random-weight policy, every batch saved (on the
    session's Ray head)."""
    from agentrl.models import prepare_initial_model
    from agentrl.warmstart.starting_policy import corpus_builder

    root = tmp_path_factory.mktemp("inspect")
    cfg = load_config("textcraft_bipace_tiny", TINY)
    start = prepare_initial_model(cfg.model, cfg.tokenizer, root / "init", corpus=corpus_builder(cfg), seed=0)
    done = run_cli(["train", "recipe=textcraft_bipace_tiny", *TINY, f"trainer.output_dir={root}", "trainer.run_name=run",
                    f"trainer.init_checkpoint={start}", "trainer.iterations=2", "trainer.eval_every=2",
                    "trainer.eval_before_train=false", "eval.num_tasks=4", "env.tasks_per_iteration=3",
                    "env.group_size=3", "env.max_steps=4", "rollout.max_response_tokens=8",
                    "rollout.invalid_action_penalty=0.1", "learner.skip_zero_advantage=false",
                    "logging.save_batches=1", "logging.wandb.mode=disabled", "logging.tensorboard=false"],
                   extra_env=ray_head)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return root / "run"


@pytest.mark.slow
def test_a_training_run_saves_its_batches_and_pictures(tiny_run):
    assert saved_iterations(tiny_run) == [1, 2]
    saved = load_saved(tiny_run, 2)
    assert saved.batch.hidden is not None and (saved.batch.policy_version == 1).all()
    assert len(saved.transcript["responses"]) == len(saved.batch) and saved.transcript["estimator"] == "bipace"
    assert {e["group_id"] for e in saved.transcript["episodes"]} == {0, 1, 2}
    png = tiny_run / "learning_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_page_of_a_real_run_in_headless_chromium(tiny_run, tmp_path):
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed: `apt-get install chromium` (scripts/setup.sh installs it "
                    "when CI=true or AGENTRL_SETUP_CHROMIUM=1)")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra: "
                                     "pip install -e '.[dev]'")
    done = run_cli(["inspect", str(tiny_run), "--iteration", "2", "--out", str(tmp_path / "page.html")])
    assert done.returncode == 0, done.stderr
    page_file = Path(done.stdout.strip().splitlines()[-1])
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(page_file.as_uri())
        # what a person reads: one section per task group, step rows, every estimator's column
        assert page.locator("section.group").count() == 3
        rows = page.locator("tr.step")
        assert rows.count() >= 9 and rows.first.is_visible()
        headers = page.locator("section.group").first.locator("thead th.adv").all_inner_texts()
        assert [h for h in headers if not h.endswith("(n/a)")] == ["GRPO", "RLOO", "REINFORCE++-baseline", "GiGPO",
                                                                   "GAGPO", "BiPACE"]
        # click a BiPACE advantage: the steps of its cluster are highlighted, the others dimmed
        bipace = headers.index("BiPACE")
        cell = page.locator(f'td.adv[data-est="{bipace}"]').first
        cell.click()
        highlighted = page.locator("td.adv.hl").count()
        assert highlighted >= 1
        assert page.locator("#status").inner_text() == f"BiPACE: {highlighted} step(s) share this step group"
        group = page.locator("section.group").first
        assert group.locator("tr.dim").count() == group.locator("tr.step").count() - highlighted
        page.screenshot(path=str(tmp_path / "inspect.png"), full_page=False)
        # filter: won trajectories only; a group stays when one of its trajectories won
        page.select_option("#outcome", "won")
        episodes = json.loads((tiny_run / "batches" / "iter_000002" / "transcript.json").read_text())["episodes"]
        assert page.locator("section.group:visible").count() == len({e["group_id"] for e in episodes if e["won"]})
        page.select_option("#outcome", "lost")
        assert page.locator("section.group:visible").count() == len({e["group_id"] for e in episodes
                                                                     if not e["won"]})
        browser.close()
    assert (tmp_path / "inspect.png").stat().st_size > 10_000
