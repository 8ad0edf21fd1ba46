"""The device check's row script (benchmarks/perf/gpu_rows.py) keeps working between the sessions that
have a GPU: its rows on the CPU, its plan, its budget and its output document."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "perf"))
import gpu_rows  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("level", ["L1", "QA", "L2-legacy"])
def test_discrete_row_steps_and_keeps_the_books(level):
    row = gpu_rows.discrete_row(level, "eager", 3, CPU)
    assert row["books_balanced"] and row["model"] == level and row["variant"] == "eager"
    assert row["steps"] == (gpu_rows.EAGER_L2_STEPS if level == "L2-legacy" else gpu_rows.TIMED_STEPS[level])
    assert row["cell_steps_per_s"] == pytest.approx(3 * row["steps"] / (row["s_per_step"] * row["steps"]))
    assert 0 < row["delivered_share"] <= 1 and row["graphs"] is None


def test_diff_row_has_finite_gradients():
    row = gpu_rows.diff_row("QAD", "eager", 2, CPU, repeats=1)
    assert (row["model"], row["variant"], row["steps"]) == ("QAD", "eager", gpu_rows.DIFF_T)
    assert row["grad_finite"] and row["fwd_bwd_s"] == pytest.approx(row["s_per_step"] * gpu_rows.DIFF_T)


def test_plan_puts_l2_legacy_first_and_covers_every_model_and_variant():
    plan = gpu_rows.plan((16, 64), (16,))
    assert plan[0] == ("discrete", "L2-legacy", "eager", 16) and plan[1][2] == "cuda_graph"
    assert {(k, m, v) for k, m, v, _ in plan} == {
        ("discrete", lv, b) for lv in ("L1", "QA", "L2-legacy") for b in ("eager", "cuda_graph")} | {
        ("diff", m, v) for m in ("L1D", "QAD") for v in ("eager", "compiled")}


def test_a_spent_budget_skips_the_rows_and_still_writes_the_document(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_rows.main(["--out", str(out), "--device", "cpu", "--small", "--budget-s", "-1",
                          "--commit", "abc1234"]) == 0
    doc = json.loads(out.read_text())
    assert doc["commit"] == "abc1234" and doc["rows"] == [] and len(doc["skipped"]) == len(gpu_rows.plan(
        (16, 64), (16, 64)))
    assert doc["skipped"][0] == "L2-legacy eager E=16"
