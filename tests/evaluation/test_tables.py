"""Tables from synthetic results with hand-computed numbers: md, LaTeX and CSV, best marked,
published reference rows, final vs peak, eval summaries, and the learning-curve plot."""

import csv
import json
import math

import pytest
import yaml

from agentrl.cli.main import main
from agentrl.evaluation.results import collect
from agentrl.evaluation.stats import describe, t_quantile_975
from agentrl.evaluation.tables import build_tables, render

SEVEN_B = "Qwen/Qwen2.5-7B-Instruct"


def make_run(root, name, env, estimator, seed, val_records=(), model=SEVEN_B, eval_summary=None):
    run = root / name
    run.mkdir(parents=True)
    cfg = {"env": {"name": env, "eval_split": "test"}, "algorithm": {"estimator": estimator},
           "model": {"name_or_path": model}, "trainer": {"seed": seed}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    with open(run / "metrics.jsonl", "w") as f:
        for step, record in val_records:
            f.write(json.dumps({"step": step, "rollout/success_rate": record["val/success_rate"] / 2}) + "\n")
            f.write(json.dumps({"step": step, **record}) + "\n")
    if eval_summary is not None:
        (run / "eval" / f"{env}_test").mkdir(parents=True)
        (run / "eval" / f"{env}_test" / "summary.json").write_text(json.dumps(eval_summary))
    return run


def alfworld_val(all_rate, pick_rate):
    return {"val/success_rate": all_rate, "val/success_rate/pick_and_place_simple": pick_rate,
            "val/success_rate/look_at_obj_in_light": 0.1}


@pytest.fixture()
def results(tmp_path):
    root = tmp_path / "results"
    # GRPO: All 70/80/90 (final), Pick 50/60/70; seed 0 peaked at 95 earlier
    for seed, (a, p) in enumerate([(0.7, 0.5), (0.8, 0.6), (0.9, 0.7)]):
        early = alfworld_val(0.95 if seed == 0 else 0.1, 0.2)
        make_run(root, f"grpo-{seed}", "alfworld", "grpo", seed, [(5, early), (10, alfworld_val(a, p))])
    # GiGPO: All 60/60/63, Pick 90/90/90
    for seed, a in enumerate([0.6, 0.6, 0.63]):
        make_run(root, f"gigpo-{seed}", "alfworld", "gigpo", seed, [(10, alfworld_val(a, 0.9))])
    # WebShop from eval summaries: seed 0 averaged over two eval seeds
    per_seed = {"0": {"success_rate": 0.5, "mean_score": 0.75}, "1": {"success_rate": 0.7, "mean_score": 0.85}}
    make_run(root, "ws-0", "webshop", "gigpo", 0, eval_summary={
        "complete": True, "episodes": 4, "split": "test", "per_seed": per_seed})
    make_run(root, "ws-1", "webshop", "gigpo", 1, eval_summary={
        "complete": True, "episodes": 2, "split": "test", "per_seed": {"0": {"success_rate": 0.4, "mean_score": 0.7}}})
    make_run(root, "ws-unfinished", "webshop", "grpo", 0, eval_summary={
        "complete": False, "episodes": 1, "split": "test", "per_seed": {"0": {"success_rate": 1.0, "mean_score": 1.0}}})
    return root


def test_student_t_quantiles():
    assert t_quantile_975(1) == pytest.approx(12.7062)
    assert t_quantile_975(2) == pytest.approx(4.3027)
    assert t_quantile_975(45) == pytest.approx(2.0141, abs=5e-4)
    assert t_quantile_975(10**6) == pytest.approx(1.96, abs=1e-3)
    stat = describe([70, 80, 90])
    assert (stat.mean, stat.std, stat.n) == (80, 10, 3)
    assert stat.ci == pytest.approx((80 - 4.3027 * 10 / math.sqrt(3), 80 + 4.3027 * 10 / math.sqrt(3)))
    assert describe([5.0]).ci is None and describe([5.0]).std is None


def test_markdown_latex_and_csv_tables(results):
    runs = collect(results)
    assert len(runs) == 8  # the unfinished eval summary and its run have no numbers
    tables = build_tables(runs)
    assert [(t.env, t.model) for t in tables] == [("alfworld", "Qwen2.5-7B-Instruct"),
                                                  ("webshop", "Qwen2.5-7B-Instruct")]
    md = render(tables, "md")
    # GRPO All: 80 ± 10, t(2) 95% interval 80 ± 24.84; best in its column
    assert "| GRPO | 3 | 60.0 ± 10.0 [35.2, 84.8] |" in md
    assert "**80.0 ± 10.0 [55.2, 104.8]**" in md
    # GiGPO: All 61 ± sqrt(3) -> half width 4.3027; Pick 90 ± 0, the best Pick
    assert "61.0 ± 1.7 [56.7, 65.3]" in md and "**61.0" not in md
    assert "**90.0 ± 0.0 [90.0, 90.0]**" in md
    # published 7B rows only, labelled with their source
    assert "| GRPO (published) | 3 | 90.8 ± 5.1 |" in md and "72.8 ± 3.6" not in md
    assert "GiGPO (arXiv 2505.10978) Table 1" in md
    # WebShop: score (75 + 70)/2... per run: (75+85)/2 = 80 and 70 -> 75 ± 7.07; success 60 and 40
    assert "**75.0 ± 7.1 [11.5, 138.5]**" in md and "**50.0 ± 14.1 [-77.1, 177.1]**" in md

    latex = render(tables, "latex")
    assert r"\textbf{80.0 $\pm$ 10.0 [55.2, 104.8]}" in latex
    assert latex.count(r"\begin{tabular}") == 2 and r"\%" in latex and "±" not in latex

    rows = list(csv.DictReader(render(tables, "csv").splitlines()))
    grpo_all = next(r for r in rows if r["method"] == "GRPO" and r["column"] == "All" and r["env"] == "alfworld")
    assert float(grpo_all["mean"]) == 80.0 and float(grpo_all["std"]) == 10.0 and grpo_all["n"] == "3"
    assert float(grpo_all["ci95_low"]) == pytest.approx(80 - 24.8416, abs=1e-3)
    assert grpo_all["best"] == "true" and grpo_all["kind"] == "measured"
    gigpo_all = next(r for r in rows if r["method"] == "GiGPO" and r["column"] == "All" and r["env"] == "alfworld")
    assert gigpo_all["best"] == "false"
    assert all(r["best"] == "false" for r in rows if r["kind"] == "published")


def test_peak_metric_and_no_reference(results):
    md = render(build_tables(collect(results, metric="peak"), references=False), "md")
    # seed 0 of GRPO peaked at 95: All over seeds 95, 80, 90
    assert "88.3 ± 7.6" in md and "(published)" not in md


def test_table_command_writes_the_table_and_a_plot(results, tmp_path, capsys):
    out = tmp_path / "table.tex"
    assert main(["table", f"results={results}", "--format", "latex", f"out={out}", f"plots={tmp_path / 'plots'}"]) == 0
    assert r"\toprule" in out.read_text()
    png = tmp_path / "plots" / "curve_alfworld_Qwen2.5-7B-Instruct.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert main(["table", f"results={tmp_path / 'nothing'}"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_start_and_gain_columns_pair_each_seed_with_its_own_warm_start(tmp_path):
    root = tmp_path / "r"
    # seed 0 starts at 40 and ends at 50, seed 1 starts at 20 and ends at 26: gains 10 and 6
    for estimator, finals in (("grpo", (0.5, 0.26)), ("gigpo", (0.45, 0.30))):
        for seed, (start, final) in enumerate(zip((0.4, 0.2), finals)):
            make_run(root, f"{estimator}-{seed}", "textcraft", estimator, seed,
                     [(0, {"val/success_rate": start}), (12, {"val/success_rate": final})], model="tiny")
    make_run(root, "no-start", "textcraft", "rloo", 0, [(12, {"val/success_rate": 0.9})], model="tiny")
    runs = {r.run_dir.name: r for r in collect(root)}
    assert runs["grpo-1"].values["Start"] == pytest.approx(20.0)
    assert runs["grpo-1"].values["Gain"] == pytest.approx(6.0)
    assert "Start" not in runs["no-start"].values
    (table,) = build_tables(list(runs.values()), references=False)
    assert table.columns == ("All", "Start", "Gain")
    rows = {r.method: r for r in table.rows}
    assert rows["GRPO"].cells["Gain"].mean == pytest.approx(8.0)
    assert rows["GiGPO"].cells["Gain"].mean == pytest.approx(7.5)
    assert rows["GRPO"].cells["Gain"].std == pytest.approx(math.sqrt(8.0))
    assert table.best["Gain"] == {"GRPO"} and table.best["All"] == {"RLOO"} and "Start" not in table.best
    md = render([table], "md")
    assert "Gain: the run's success minus its own Start" in md
    assert "| GRPO | 2 | 38.0" in md


def test_a_sweeps_unfinished_cells_are_left_out_of_the_table(tmp_path, capsys):
    root = tmp_path / "sweep"
    cells = {}
    for name, state in (("grpo-0", "done"), ("grpo-1", "running"), ("grpo-2", "failed")):
        run = make_run(root / "runs", name, "textcraft", "grpo", int(name[-1]),
                       [(0, {"val/success_rate": 0.2}), (6, {"val/success_rate": 0.4})], model="tiny")
        cells[name] = {"state": state, "run_dir": str(run)}
    (root / "manifest.json").write_text(json.dumps({"cells": cells}))
    assert [r.run_dir.name for r in collect(root)] == ["grpo-0"]
    assert main(["table", f"results={root}", "--format", "csv", "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "left out 2 sweep cell(s) that are not done: grpo-1 (running), grpo-2 (failed)" in err
