"""Smoke tests of the studies (benchmarks/diff/{sensitivity,opt_rates,placement,nn_proxy}.py):
each core function runs at a tiny size and returns the artifact's keys; the pieces the
numbers rest on (CRN, per-replicate KPIs, the bootstrap, the schedule) are checked."""

import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "diff"))

import _optimise  # noqa: E402
import nn_proxy  # noqa: E402
import opt_rates  # noqa: E402
import placement  # noqa: E402
import sensitivity  # noqa: E402
from _common import Stage  # noqa: E402

STUDIES = ("sensitivity", "opt_rates", "placement", "nn_proxy")


def _ci_config() -> dict:
    """The ci profile as Snakemake runs it: config/ci.yaml merged over config/config.yaml."""
    from snakemake.utils import update_config

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    update_config(cfg, yaml.safe_load((REPO / "config" / "ci.yaml").read_text()))
    return cfg


CI = _ci_config()
ARTIFACT_KEYS = {"provenance", "config", "summary", "table", "figure"}


def tiny(name: str, **over) -> dict:
    params = copy.deepcopy(CI[name])
    params.update(over)
    return params


def test_sensitivity_runs_and_reports_every_row():
    heavy = [op for op in CI["sensitivity"]["ops"] if op["name"] == "heavy"]
    params = tiny("sensitivity", level="L1", n_seeds=3, T=6, warmup=1, modes=["QA"], n_boot=50, ops=heavy)
    out = sensitivity.compute(params, progress=False)
    assert len(out["table"]) == len(sensitivity.KPIS) * len(sensitivity.INPUTS)
    assert set(out["table"][0]["models"]) == {"QAD mf", "QAD rb"}  # no calibration file: uncalibrated only
    assert {"op", "derivative", "fd_mean", "fd_se", "fd_significant"} <= set(out["table"][0])
    for key in ("QAD_mf_stage_sign_agree_frac", "QAD_rb_stage_median_ratio", "QAD_rb_stage_within_x2_frac",
                "n_seeds", "fd_step_p", "wall_l2_fd_s"):
        assert key in out["summary"]
    assert {m["points"] for m in out["metrics"]} == {"stage"}
    v = out["values"][0]
    assert v["fd_step_p"] == pytest.approx(params["fd_steps"]["p"] * params["R"] / v["R"])
    assert all(len(r["grad"]) == 3 and len(r["fd"]) == 3 for r in out["rows"])
    assert {r["verdict"] for r in out["rows"]} <= set(sensitivity.VERDICTS)


def test_least_p_is_the_vertex_of_a_parabola_in_log_p_and_flags_the_grids_end():
    ps = [0.1, 0.15, 0.2, 0.3, 0.4]
    best = 0.22
    vals = [(math.log(p) - math.log(best)) ** 2 + 3.0 for p in ps]
    p, inside = sensitivity.least_p(ps, vals)
    assert inside and p == pytest.approx(best, rel=1e-9)
    assert sensitivity.least_p(ps, [5.0, 4.0, 3.0, 2.0, 1.0]) == (0.4, False)  # falls to the end
    assert sensitivity.least_p(ps, [1.0, 2.0, 3.0, 4.0, 5.0]) == (0.1, False)
    p, inside = sensitivity.least_p(ps, [2.0, 1.0, 1.0, 1.0, 2.0])  # a tie: its first value and neighbours
    assert inside and 0.15 < p < 0.2
    for bad_ps, bad_vals in (([0.1, 0.2], [1.0, 2.0]), ([0.2, 0.1, 0.3], [1.0, 0.0, 1.0]),
                             ([0.1, 0.2, 0.3], [1.0, math.nan, 1.0]), ([0.0, 0.1, 0.2], [1.0, 0.0, 1.0])):
        with pytest.raises(ValueError, match="ps, values"):
            sensitivity.least_p(bad_ps, bad_vals)


def test_sensitivity_optimum_grid_refuses_what_it_cannot_run():
    op = {"name": "heavy", "p": 0.5}
    params = tiny("sensitivity", optimum={"kpi": "mean_aoi", "factors": [0.5, 1.0, 2.0]})
    assert sensitivity.optimum_grid(params, op) == [0.25, 0.5, 1.0]
    for spec, match in ((None, "sensitivity.optimum:"),
                        ({"kpi": "aoi", "factors": [0.5, 1.0, 1.5]}, "optimum.kpi"),
                        ({"kpi": "mean_aoi", "factors": [1.0, 0.5, 1.5]}, "optimum.factors"),
                        ({"kpi": "mean_aoi", "factors": [0.5, 1.0]}, "optimum.factors"),
                        ({"kpi": "mean_aoi", "factors": [0.5, 1.0, 2.1]}, "keeps p <= 1")):
        with pytest.raises(ValueError, match=match):
            sensitivity.optimum_grid({**params, "optimum": spec}, op)


def test_sensitivity_optimum_runs_each_p_on_the_points_own_replicates():
    """The curve of least AoI at factor 1 is the point's own KPI, on the level and on each model (the
    same replicates, engine seed and send uniforms); what following a model gives up is the level's
    KPI at the model's p over its KPI at its own, less one."""
    heavy = [{**op, "optimum": True} for op in CI["sensitivity"]["ops"] if op["name"] == "heavy"]
    params = tiny("sensitivity", level="L1", n_seeds=3, T=8, warmup=1, modes=["QA"], sends=["rb"], n_boot=20,
                  ops=heavy, optimum={"kpi": "mean_aoi", "factors": [0.4, 0.7, 1.0, 1.4, 1.9]})
    part = sensitivity.compute_op(params, "heavy", {}, progress=False)
    v, o = part["values"], part["values"]["optimum"]
    assert o["kpi"] == "AoI" and o["p"] == pytest.approx([0.2, 0.35, 0.5, 0.7, 0.95])
    assert o["L2"]["curve"][2] == v["L2"]["AoI"]
    assert o["models"]["QAD rb"]["curve"][2] == pytest.approx(v["models"]["QAD rb"]["AoI"], rel=1e-6)
    assert o["L2"]["curve"][0] != o["L2"]["curve"][4]  # p moves the KPI
    for who in [o["L2"], *o["models"].values()]:
        assert 0.2 <= who["best_p"] <= 0.95 and isinstance(who["inside"], bool)
    m = o["models"]["QAD rb"]
    assert m["L2_lost"] == pytest.approx(m["L2_at_best"] / o["L2"]["at_best"] - 1.0)
    assert part["wall_optimum_s"] > 0
    plain = {**params, "ops": [{**heavy[0], "optimum": False}]}
    assert "optimum" not in sensitivity.compute_op(plain, "heavy", {}, progress=False)["values"]


def test_sensitivity_runs_a_calibrated_model_at_its_own_temperature(monkeypatch):
    """The calibrated column runs the calibration's cell at ``cal.tau``; the plain one at the stage's tau."""
    from isaac_net.core import CellConfig

    class FakeCal:
        tau = 0.3

        def at(self, R):  # one set of constants for every fleet size
            return self

        def apply(self, cfg, **kw):
            return CellConfig(rate_factor=0.5)

    real, seen = sensitivity.model_gradients, []

    def spy(base, mode, sends, n_seeds, T, warmup, tau, lam, cfg):
        seen.append((sends, tau, cfg.rate_factor))
        return real(base, mode, sends, n_seeds, T, warmup, tau, lam, cfg)

    monkeypatch.setattr(sensitivity, "model_gradients", spy)
    heavy = [op for op in CI["sensitivity"]["ops"] if op["name"] == "heavy"]
    params = tiny("sensitivity", level="L1", n_seeds=2, T=4, warmup=1, modes=["QA"], sends=["rb"], n_boot=20,
                  ops=heavy, tau=0.05)
    sensitivity.compute_op(params, "heavy", {("QA", "rb"): FakeCal()}, progress=False)
    assert seen == [("rb", 0.05, 1.0), ("rb", 0.3, 0.5)]


def test_sensitivity_point_does_not_depend_on_the_other_points():
    """A point's rows, bootstrap intervals included, are the same whatever other points the config
    lists and in whatever order (its bootstrap stream is seeded by its name)."""
    ops = {op["name"]: op for op in CI["sensitivity"]["ops"]}
    extra = {**ops["heavy"], "name": "aaa_first"}  # sorts before every other name

    def rows(op_list):
        params = tiny("sensitivity", level="L1", n_seeds=6, T=8, warmup=1, modes=["QA"], sends=["rb"],
                      n_boot=40, ops=op_list)
        return sensitivity.compute_op(params, "heavy", {}, progress=False)["rows"]

    others = [o for n, o in ops.items() if n != "heavy"]
    alone, crowded = rows([ops["heavy"]]), rows([ops["heavy"], extra, *others])
    assert any(math.isfinite(r["ratio_lo"]) for r in alone)  # the test sees bootstrap intervals
    assert json.dumps(alone, sort_keys=True) == json.dumps(crowded, sort_keys=True)


def test_replicate_kpis_equal_the_batch_means_for_one_replicate():
    from isaac_net.core.diff.reference import discrete_rollout

    g = torch.Generator().manual_seed(0)
    res = discrete_rollout("L1", 8, torch.full((3, 4), 0.5), torch.full((3, 4), 2e4),
                           snr_db=10 + 20 * torch.rand(3, 4, generator=g), warmup=2, generator=g)
    per = sensitivity.replicate_kpis(res, 1)
    env = _optimise.env_kpis(res)
    for k in sensitivity.KPIS:
        torch.testing.assert_close(per[k][0], res[k].to(per[k].dtype))
        assert env[k].shape == (3,)


def test_fd_step_in_p_flips_the_same_sends_per_cell_at_every_fleet_size():
    """At R robots the half step in p is the stage's times R_stage / R: 2 h R is the stage's; the
    other inputs' steps are the stage's; a bad R is named."""
    params = tiny("sensitivity", R=8, fd_steps={"p": 0.05, "kbytes": 2.0, "tx_db": 1.0, "dist_m": 5.0})
    assert sensitivity.fd_steps_at(params, 8) == {"p": 0.05, "kbytes": 2.0, "tx_db": 1.0, "dist_m": 5.0}
    at48 = sensitivity.fd_steps_at(params, 48)
    assert at48["p"] == pytest.approx(0.05 / 6) and 2 * at48["p"] * 48 == pytest.approx(2 * 0.05 * 8)
    assert {k: at48[k] for k in ("kbytes", "tx_db", "dist_m")} == {"kbytes": 2.0, "tx_db": 1.0, "dist_m": 5.0}
    assert params["fd_steps"]["p"] == 0.05  # the stage's steps are not changed in place
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="R: expected a positive int"):
            sensitivity.fd_steps_at(params, bad)


def test_fd_runs_share_random_numbers():
    """Two L2-legacy runs with the same seed and uniforms and a zero step give equal KPIs."""
    base = sensitivity.problem({"p": 0.5, "sizes_bytes": [20000]}, 2, 1, 3, 6, 0, torch.float32)
    fd, _ = sensitivity.l2_fd(base, 2, 6, 1, {k: 1e-30 for k in sensitivity.INPUTS}, 0, None,
                              torch.float32, "L2-legacy")
    assert all(float(v.abs().max()) == 0.0 for v in fd.values())


def test_ratio_interval():
    rng = np.random.default_rng(0)
    ref = 2.0 + 0.1 * rng.standard_normal(32)
    ratio, lo, hi = sensitivity.ratio_ci(0.5 * ref, ref, 500, rng)
    assert ratio == pytest.approx(0.5) and lo <= 0.5 <= hi
    noise = rng.standard_normal(32)
    _, lo, hi = sensitivity.ratio_ci(ref, noise - noise.mean(), 500, rng)
    assert lo == -math.inf and hi == math.inf  # the FD mean straddles zero: no interval


def test_anneal_is_geometric():
    assert _optimise.anneal(0.2, 0.02, 0, 150) == pytest.approx(0.2)
    assert _optimise.anneal(0.2, 0.02, 149, 150) == pytest.approx(0.02)
    assert _optimise.anneal(0.2, 0.02, 1, 3) == pytest.approx(math.sqrt(0.2 * 0.02))
    # a calibrated model stays at the temperature it was fitted at once the schedule reaches it
    floored = [_optimise.anneal(0.2, 0.02, i, 3, tau_min=0.1) for i in range(3)]
    assert floored == pytest.approx([0.2, 0.1, 0.1])
    assert _optimise.anneal(0.2, 0.02, 0, 1, tau_min=0.3) == 0.3


@pytest.mark.parametrize("study", ["opt_rates", "placement"])
def test_optimisation_studies_write_the_artifact(study, tmp_path):
    params = tiny(study, E=2, R=3, iters=2, candidates=3, T=5, warmup=1, T_eval=6, warmup_eval=1,
                  score_every=1, proxy=False,
                  models=[{"mode": "QA", "sends": "relaxed", "calibrated": False},
                          {"mode": "QA", "sends": "mean_field", "calibrated": False}],
                  targets={"solution": "gradient, QAD relaxed", "start_envs_min": 0.5})
    module = {"opt_rates": opt_rates, "placement": placement}[study]
    out = {"json": str(tmp_path / f"{study}.json"), "figure": str(tmp_path / f"{study}.png")}
    with Stage(study, params, "test", 1) as stage:
        module.main(stage, params, out)
    data = json.loads(Path(out["json"]).read_text())
    assert ARTIFACT_KEYS <= set(data) and (tmp_path / data["figure"]).exists()
    names = {"start", "gradient, QAD relaxed", "gradient, QAD mean-field", "random search"}
    if study == "opt_rates":
        names.add("uniform policy")
        grid = params["uniform"]
        assert data["uniform_policy"]["policies"] == len(grid["p"]) * len(grid["tx_dbm"])
    assert {r["solution"] for r in data["table"]} == names
    assert all(len(data["env_costs"][n]) == 2 for n in names)
    by = {r["solution"]: r for r in data["table"]}
    for c in data["comparisons"]:  # the paired difference is the difference of the mean costs
        assert c["vs_start_diff"] == pytest.approx(by[c["solution"]]["cost"] - by["start"]["cost"], rel=1e-6)
        assert c["vs_start_lo"] <= c["vs_start_diff"] <= c["vs_start_hi"]
        assert c["vs_start"] in ("better", "worse", "tie")
    assert data["targets"]["available"] and isinstance(data["targets"]["met"], bool)
    hist = data["history"]["gradient, QAD relaxed"]
    assert len(hist) == 2 and "level_cost_heldout" in hist[-1]


def test_uniform_policy_is_the_best_of_its_grid():
    params = tiny("opt_rates", E=2, R=3, T_eval=6, warmup_eval=1,
                  uniform={"p": [0.1, 0.9], "tx_dbm": [5.0, 23.0]})
    sc = _optimise.scenario(2, 3, params, torch.float32)
    dec = opt_rates.RateDecisions(sc, params)
    best, info = _optimise.uniform_search(sc, params, dec, progress=False)
    grid = [(p, t) for p in params["uniform"]["p"] for t in params["uniform"]["tx_dbm"]]
    # The policies are scored as one batch of envs (policy-major), as the search does.
    u = sc["u_train"].repeat(1, len(grid), 1)
    k = _optimise.discrete_score(params["level"], 6, 1, dec.uniform(grid), u, cfg=None, seed=params["seed"],
                                 dtype=torch.float32)
    costs = _optimise.env_cost(k, params["cost"]).reshape(len(grid), 2).mean(-1).tolist()
    assert (info["p"], info["tx_dbm"]) == grid[min(range(len(grid)), key=costs.__getitem__)]
    assert info["train_cost"] == pytest.approx(min(costs), rel=1e-6)
    assert float(best["p"].unique()) == pytest.approx(info["p"])


def test_random_search_keeps_the_best_candidate():
    # A deterministic level: L2-legacy's draws depend on the env's index in the batch.
    params = tiny("opt_rates", level="L1", E=2, R=3, candidates=4, T_eval=6, warmup_eval=1, rs_chunk_envs=4)
    sc = _optimise.scenario(2, 3, params, torch.float32)
    dec = opt_rates.RateDecisions(sc, params)
    best = _optimise.random_search(sc, params, dec, progress=False)
    kept = _optimise.discrete_score(params["level"], 6, 1, best, sc["u_train"], cfg=None, seed=params["seed"],
                                    dtype=torch.float32)
    cost = _optimise.env_cost(kept, params["cost"])
    # Every candidate of the same draw is at least as costly as the kept one.
    cands = dec.sample(4, _optimise.generator(params["seed"] + 2))
    k = _optimise.discrete_score(params["level"], 6, 1, cands, sc["u_train"].repeat(1, 4, 1), cfg=None,
                                 seed=params["seed"], dtype=torch.float32)
    all_costs = _optimise.env_cost(k, params["cost"]).reshape(4, 2)
    torch.testing.assert_close(cost, all_costs.min(0).values)


def test_placement_movement_cost():
    params = tiny("placement", E=2, R=3)
    sc = _optimise.scenario(2, 3, params, torch.float64)
    d = placement.PlacementDecisions(sc, params)
    with torch.no_grad():
        assert float(d.extra_cost(d(d.init())).abs().max()) == 0.0
    moved = d({"pos": sc["pos"] + torch.tensor([30.0, 40.0], dtype=torch.float64)})
    expected = params["move_weight"] * (math.sqrt(50.0 ** 2 + 1.0) - 1.0)
    torch.testing.assert_close(d.extra_cost(moved), torch.full((2,), expected, dtype=torch.float64))


def test_nn_proxy_study_reports_heldout_r2_per_kpi(tmp_path):
    params = tiny("nn_proxy", R=3, train_cells=12, test_cells=4, T=8, warmup=2, epochs=5, grad_cells=6,
                  n_boot=50)
    model = tmp_path / "nn_proxy.pt"
    out = nn_proxy.compute(params, str(model), progress=False)
    s = out["summary"]
    from isaac_net.core.diff import proxy as px

    for k in px.TARGETS:
        assert f"heldout_r2_{k}" in s and f"heldout_mean_rel_err_{k}" in s
    assert s["reload_max_abs_diff"] == 0.0 and model.exists()
    assert len(out["table"]) == len(px.TARGETS) * 3
    assert {"derivative", "proxy", "fd_mean", "fd_se", "sign_agree", "ratio", "ci"} <= set(out["table"][0])
