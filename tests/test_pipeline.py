"""The pipeline (Snakefile, config profiles, reports/): rendering from artifacts, schema
errors, the number check, the jobs of each profile, and what a changed setting reruns.

The snakemake tests run in a temporary copy of the workflow whose stage scripts are
replaced by stubs that write the fixture artifacts below, so they need no torch work.
"""

import copy
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jinja2
import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "reports"))
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

import check_numbers  # noqa: E402
import render  # noqa: E402
import stage_registry  # noqa: E402

from isaac_net.core.kpi import BY_BATCH_KEY  # noqa: E402

SNAKEMAKE = Path(sys.executable).with_name("snakemake")
PROFILES = {"full": "config/config.yaml", "smoke": "config/smoke.yaml", "ci": "config/ci.yaml"}
STAGE_JOBS = {stage["rule"] for stage in stage_registry.load().values()}  # the rules the stages generate
STUDIES = ("sensitivity", "opt_rates", "placement", "nn_proxy")


# ------------------------------------------------------------------------------ fixtures
def _prov(stage: str, config: dict) -> dict:
    return {
        "stage": stage, "profile": "fixture", "config": config, "seeds": {"seed": 7},
        "git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": False,
        "python": "3.11.7", "torch": "2.13.0+cpu", "device": "cpu", "torch_threads": 1,
        "cpu_model": "Fixture CPU", "load_avg_start": [0.25, 0.2, 0.1], "load_avg_end": [0.75, 0.3, 0.2],
        "wall_s": 12.5,
    }


def fixture_artifacts() -> dict[str, dict]:
    """One artifact per stage with distinctive numbers (the generic one for sensitivity)."""
    eq_cfg = {"seed": 7, "E": 8, "R": 6, "T": 50, "tol": 1e-4, "cases": {
        "normal": {"p": 0.4, "sizes_bytes": [4000, 30000], "snr_db": [10.0, 30.0], "cell": {}},
        "overload": {"p": 0.9, "sizes_bytes": [30000, 60000], "snr_db": [0.0, 15.0],
                     "cell": {"buffer_msgs": 4, "timeout_steps": 6}}}}
    eq_rows = []
    for case, (F, A, binds) in {"normal": (8, 10, False), "overload": (4, 6, True)}.items():
        for mode, pair in (("L1", "L1D vs L1"), ("QA", "QAD vs QA")):
            eq_rows.append({"case": case, "mode": mode, "pair": pair, "p": eq_cfg["cases"][case]["p"],
                            "max_abs_delivered": 0.0, "max_abs_timeouts": 0.0, "max_abs_overflow": 0.0,
                            "max_abs_aoi": 0.0, "max_abs_queued_msgs": 0.0, "max_rel_delay_sum": 3.3e-16,
                            "max_rel_energy_j": 0.0, "max_rel_throughput_bytes_per_s": 2.5e-16,
                            "offered": 137.0, "delivered": 91.0,
                            "timeouts": 23.0 if binds else 0.0, "overflow": 17.0 if binds else 0.0,
                            "buffer_msgs": F, "timeout_steps": A, "binds": binds, "pass": True})
    equivalence = {"summary": {"tau": 0.0, "tol": 1e-4, "all_pass": True, "max_abs_count_diff": 0.0,
                               "max_rel_delay_sum": 3.3e-16, "max_rel_energy_j": 0.0,
                               "max_rel_throughput_bytes_per_s": 2.5e-16},
                   "table": eq_rows, "provenance": _prov("equivalence", eq_cfg)}

    taus = [0.0, 0.2, 0.05, 0.002]
    conv_rows = []
    for t in taus:
        row = {"tau": t}
        for m, base, aoi in (("L1", 0.382, 2.501), ("QA", 0.638, 2.725)):
            row.update({f"{m}_mean_delay": base * (1 + 1.5 * t), f"{m}_mean_aoi": aoi * (1 + 0.6 * t),
                        f"{m}_delivery_ratio": 0.99, f"{m}_mean_delay_err_pct": 150.0 * t,
                        f"{m}_mean_aoi_err_pct": 60.0 * t, f"{m}_delivery_ratio_err_pct": 0.01 * t,
                        f"{m}_delay_bias": base * 1.5 * t})
        conv_rows.append(row)
    conv_summary = {"default_tau": 0.05, "tau_min": 0.002, "tau_max": 0.2, "max_delivery_err_pct": 0.002,
                    "delay_biased_up": True, "max_delay_err_pct_at_default": 7.5,
                    "max_delay_err_pct_at_min": 0.3, "min_delay_err_pct_at_max": 30.0}
    for m, base, aoi in (("L1", 0.382, 2.501), ("QA", 0.638, 2.725)):
        conv_summary.update({f"{m}_discrete_delay": base, f"{m}_discrete_aoi": aoi,
                             f"{m}_discrete_delivery": 0.99, f"{m}_tau0_delay_err_pct": 0.0,
                             f"{m}_delay_err_pct_at_default": 7.5, f"{m}_delay_err_pct_at_min": 0.3,
                             f"{m}_delay_err_pct_at_max": 30.0, f"{m}_aoi_err_pct_at_default": 3.0,
                             f"{m}_delay_err_slope": 1.0,
                             f"{m}_delay_err_trend": "falls roughly linearly in tau",
                             f"{m}_delay_biased_up": True, f"{m}_delay_bias_direction": "upward"})
    conv_cfg = {"seed": 7, "default_tau": 0.05, "table": {"E": 16, "R": 8, "T": 60, "p": 0.4,
                "sizes_bytes": [4000, 30000], "snr_db": [10.0, 30.0], "taus": taus}}
    convergence = {"summary": conv_summary, "table": conv_rows, "provenance": _prov("convergence", conv_cfg)}

    ctaus = [0.2, 0.05, 0.002]
    curves = [{"mode": m, "load": load, "discrete": 0.5, "taus": ctaus, "relaxed": [0.6, 0.53, 0.501],
               "err_pct": [20.0, 6.0, 0.2], "slope": 1.05} for load in (0.2, 0.4, 0.6) for m in ("L1", "QA")]
    curves_cfg = {"seed": 7, "curves": {"E": 64, "R": 8, "T": 200, "loads": [0.2, 0.4, 0.6],
                                        "sizes_bytes": [4000, 30000], "snr_db": [10.0, 30.0], "taus": ctaus}}
    convergence_curves = {
        "summary": {"min_slope": 1.05, "max_slope": 1.05, "max_err_pct_at_min_tau": 0.2, "tau_min": 0.002,
                    "delay_biased_up": True},
        "table": [{"mode": c["mode"], "load": c["load"]} for c in curves], "curves": curves,
        "figure": "convergence_curves.png", "provenance": _prov("convergence_curves", curves_cfg)}

    gc_rows = [{"mode": m, "kpi": k, "label": BY_BATCH_KEY[k].label, "input": i, "pass": True,
                "max_abs_gap": None, "max_grad": 1.0, "kpi_scale": 1.0, "nonzero": True}
               for m in ("L1", "QA") for k in ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j")
               for i in ("p", "B", "tx", "pos")]
    gc_cfg = {"seed": 7, "tau": 0.05, "modes": ["L1", "QA"], "small": {
        "E": 2, "R": 3, "T": 4, "p": 0.5, "sizes_bytes": [4000, 30000], "deadline": 3.5,
        "cell": {"num_slots": 4, "qa_sr_slots": 1, "buffer_msgs": 3, "timeout_steps": 4},
        "eps": 1e-6, "atol": 1e-5, "rtol": 1e-3}}
    gradcheck = {"summary": {"tau": 0.05, "all_pass": True, "num_checks": 32, "num_pass": 32,
                             "num_nonzero": 29, "max_abs_gap": None, "num_slots": 4, "buffer_msgs": 3,
                             "timeout_steps": 4},
                 "table": gc_rows, "provenance": _prov("gradcheck", gc_cfg)}

    steps = [1e-2, 1e-3, 1e-4, 1e-5]
    fd_rows = [{"mode": m, "input": i, "autograd": 0.4321, "fd": [0.44, 0.4322, 0.4321, 0.4321],
                "rel_err": [0.017, 1.7e-4, 1.7e-6, 3.9e-6], "best_rel_err": 1.7e-6, "slope": 1.9}
               for m in ("L1", "QA") for i in ("p", "B", "tx", "pos")]
    expected_signs = (("mean_delay", "B", "+", 0.0123), ("mean_delay", "p", "+", 0.75),
                      ("mean_delay", "tx", "-", -0.0456), ("mean_energy_j", "tx", "+", 4.5e-5))
    signs = [{"mode": m, "kpi": k, "input": i, "expected": e, "grad_sum": g, "pass": True}
             for m in ("L1", "QA") for k, i, e, g in expected_signs]
    fd_cfg = {"seed": 7, "tau": 0.05, "modes": ["L1", "QA"], "fd": {
        "E": 32, "R": 8, "T": 60, "p": 0.4, "sizes_bytes": [4000, 30000], "cell": {"num_slots": 40},
        "steps": steps, "tol": 1e-4, "weights": {"mean_delay": 1.0, "mean_aoi": 0.5, "mean_energy_j": 50.0}}}
    fd_check = {"summary": {"tau": 0.05, "tol": 1e-4, "max_best_rel_err": 1.7e-6, "all_match": True,
                            "min_slope": 1.9, "max_slope": 1.9,
                            "min_slope_large": 2.0, "max_slope_large": 2.0,
                            "trend": "shrinks roughly quadratically with the step",
                            "step_max": 1e-2, "step_min": 1e-5, "max_err_at_step_max": 0.017,
                            "max_err_at_step_min": 3.9e-6, "signs_pass": True, "num_slots": 40},
                "table": [], "rows": fd_rows, "signs": signs, "steps": steps, "figure": "fd_check.png",
                "provenance": _prov("fd_check", fd_cfg)}

    cost_cfg = {"seed": 7, "tau": 0.05, "dtype": "float32", "p": 0.4, "sizes_bytes": [4000, 30000],
                "modes": ["L1", "QA"], "E": [16, 64], "R": 8,
                "T": 60, "compile": [False, True], "threads": [1, 2], "timeout_s": 900, "repeats": 2,
                "l2_legacy": True, "large": {"E": 1024, "T": 200}, "speedup_bar": 7,
                "warmup": {"E": 16, "cold_s": 60, "cold_ratio": 400, "warm_s": 5},
                "targets_s": [{"model": "L1D", "variant": "compiled", "E": 16, "s": 0.1}],
                "earlier_s": {"T": 60, "L1D_fwd_bwd": {"16": [10.8, 11.1], "64": [22.1, 16.5]},
                           "L2_legacy_fwd": 27.0}}
    row = {"model": "L1D", "device": "cpu", "R": 8, "T": 60, "threads": 1, "peak_cuda_mib": None,
           "available": True, "slots": "tape"}
    cost_rows = [
        {**row, "variant": "eager", "E": 16, "compile": False, "forward_s": 0.4, "backward_s": 0.5,
         "peak_rss_mib": 345.0, "earlier_ratio": 24.3},
        {**row, "variant": "per-slot autograd", "E": 16, "compile": False, "forward_s": 0.8,
         "backward_s": 1.0,
         "peak_rss_mib": 351.0, "earlier_ratio": 12.2},
        {**row, "model": "QAD", "variant": "eager", "E": 1024, "compile": False, "forward_s": 0.09,
         "backward_s": 0.1, "peak_rss_mib": 400.0, "earlier_ratio": None},
        {**row, "model": "QAD", "variant": "compiled", "E": 1024, "compile": True,
         "forward_s": 0.15, "backward_s": 0.13, "peak_rss_mib": 480.0, "earlier_ratio": None},
        {**row, "variant": "compiled", "E": 64, "compile": True, "threads": 2, "available": False,
         "error": "timed out after 900 s", "earlier_ratio": None},
    ]
    large = {**row, "variant": "eager", "E": 1024, "T": 200, "compile": False, "forward_s": 21.0,
             "backward_s": 24.8, "peak_rss_mib": 3310.0, "earlier_ratio": None, "slots": "recompute"}
    speedups = [{"E": 16, "per_slot_autograd_s": 1.8, "eager_s": 0.9, "compiled_s": 0.12,
                 "eager_speedup": 2.0,
                 "compiled_speedup": 15.0}]
    cost = {"summary": {"dtype": "float32", "tau": 0.05, "num_slots": 40, "peak_rss_mib": 345.0,
                        "l2_legacy_available": False, "compile_available": False, "num_failed": 1,
                        "cuda_available": False},
            "table": cost_rows + [large], "speedups": speedups, "large": large,
            "warmups": [{"model": "L1D", "E": 16, "fresh_s": 55.0, "fresh_import_s": 6.1,
                         "fresh_steady_s": 0.3, "cold_s": 47.5, "cold_steady_s": 0.31, "cold_ratio": 153.2,
                         "cold_import_s": 5.9, "warm_s": 6.8, "warm_import_s": 4.4, "warm_steady_s": 0.29,
                         "cold_met": True, "warm_met": False, "eager_steady_s": 0.9,
                         "compiled_steady_s": 0.12, "pays": True, "fresh_break_even": 71,
                         "cold_break_even": 61, "warm_break_even": 9},
                        {"model": "QAD", "E": 16, "fresh_s": 20.0, "fresh_import_s": 1.3,
                         "fresh_steady_s": 0.026, "cold_s": 10.5, "cold_steady_s": 0.025, "cold_ratio": 420.0,
                         "cold_import_s": 1.2, "warm_s": 2.4, "warm_import_s": 1.0, "warm_steady_s": 0.03,
                         "cold_met": False, "warm_met": True, "eager_steady_s": 0.03,
                         "compiled_steady_s": 0.036, "pays": False, "fresh_break_even": None,
                         "cold_break_even": None, "warm_break_even": None}],
            "targets": [{"model": "L1D", "variant": "compiled", "E": 16, "s": 0.1, "measured_s": 0.12,
                         "met": False}],
            "unavailable": {"L2-legacy": "ModuleNotFoundError: no l2_legacy"},
            "provenance": _prov("cost", cost_cfg)}

    sensitivity = sensitivity_artifact()
    return {"equivalence": equivalence, "convergence": convergence, "convergence_curves": convergence_curves,
            "gradcheck": gradcheck, "fd_check": fd_check, "cost": cost, "sensitivity": sensitivity,
            "calibration": calibration_artifact(), "opt_rates": optimisation_artifact("opt_rates"),
            "fleet_opt": fleet_opt_artifact(), "gpu": gpu_artifact()}


# The fleet optimisation (benchmarks/diff/fleet_opt.py): synthetic job payloads, merged by the stage's
# own merge. At R = 8 CMA-ES overtakes the gradient by 10 t and the uniform policy is close to the
# best; at R = 32 CMA-ES and TPE never reach the gradient, charged in full or not.
FLEET_CFG = {"seed": 7, "level": "L2-legacy", "E": 4, "T_eval": 40, "warmup_eval": 8, "budget_factor": 10,
             "budgets": [1, 3, 10], "cover_calibration_R": [32], "cover_calibration_methods": ["cmaes"],
             "cover_wall_s": 40.0,
             "p_init": 0.5, "p_init_ref_R": 8, "tx_init_dbm": 20.0, "hybrid_sigma0": 0.05,
             "random_per_round": 16,
             "models": [{"mode": "L1", "sends": "relaxed", "compile": True},
                        {"mode": "QA", "sends": "relaxed"}, {"mode": "QA", "sends": "mean_field"}],
             "choose_from": [{"mode": "QA", "sends": "relaxed"}, {"mode": "QA", "sends": "mean_field"}],
             "n_boot": 200, "gradient": {"iters": 60, "T": 16, "lr": 0.1, "tau_start": 0.2, "tau_end": 0.02},
             "cost": {"weights": {"mean_delay": 1.0, "mean_aoi": 0.5, "mean_energy_j": 50.0},
                      "penalty": 100.0},
             "targets": {"amortised_R": [32], "budget": 10, "better_cells_min": 0.8, "charged_R": [32]}}


def _fleet_trace(*points):
    """Trace rows of ``(wall_s, rollouts, cells)``, with the mean."""
    return [{"wall_s": w, "rollouts": r, "heldout_cost": sum(cells) / len(cells), "heldout_cells": cells}
            for w, r, cells in points]


def _fleet_result(name, trace, **info):
    return {"name": name, "wall_s": trace[-1]["wall_s"], "rollouts": trace[-1]["rollouts"],
            "heldout_cells": trace[-1]["heldout_cells"], "trace": trace, "info": info}


def fleet_opt_jobs(R: int) -> tuple[dict, list]:
    """The gradient job's payload (the proxy's job folded in) and the black-box jobs' at fleet size
    ``R`` (t = 2 s, the calibration 20 s; CMA-ES runs 10 t + 20 s where R is covered)."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import fleet_opt

    start = [8.0, 8.2, 7.9, 8.1]
    grad = [3.0, 3.2, 2.9, 3.1]

    def shift(v):
        return [x + v for x in grad]

    gradients = {"gradient, L1D relaxed, calibrated": shift(0.5), "gradient, QAD relaxed, calibrated": grad,
                 "gradient, QAD mean-field, calibrated": shift(1.0)}
    # L1D (not a candidate) takes 5 s, the candidates 1 s each; the choice is charged both, t = 2 s.
    results = {n: _fleet_result(n, _fleet_trace((0.0, 0, start), (5.0 if "L1D" in n else 1.0, 0, c)))
               for n, c in gradients.items()}
    results["gradient (chosen model)"] = _fleet_result(
        "gradient (chosen model)", _fleet_trace((0.0, 0, start), (2.0, 12, grad)))
    uniform = [3.1, 3.0, 3.3, 3.0] if R == 8 else [6.0, 6.4, 5.9, 6.3]
    results["uniform policy"] = _fleet_result("uniform policy", _fleet_trace((0.0, 280, uniform)), p=0.3,
                                              tx_dbm=17.0)
    payload = {"R": R, "E": 4, "chosen": "gradient, QAD relaxed, calibrated", "t_grad_s": 2.0,
               "select_s": 0.1,
               "select_rollouts": 12,
               "train_cost": {n: sum(c) / 4 for n, c in gradients.items() if "QAD" in n},
               "calibration_cost": {"targets_s": 5.0, "fit_s": 15.0, "total_s": 20.0},
               "model_calibration_cost": {n: {"total_s": 30.0 if "L1D" in n else 12.5} for n in gradients},
               "results": results}
    # The neural proxy's job (0.5 s, its fit 3 s), folded in as the merge does.
    px_trace = _fleet_trace((0.0, 0, start), (0.5, 0, shift(-0.5) if R == 8 else shift(4.0)))
    proxy = {"R": R, "model": "proxy", "calibration_cost": {"total_s": 3.0, "kind": "proxy"},
             "result": _fleet_result("gradient, neural proxy", px_trace)}
    payload = fleet_opt.with_models(payload, [proxy])
    late = [2.0, 2.1, 1.9, 2.2] if R == 8 else [5.0, 5.3, 4.8, 5.1]
    boxes = [
        ("cmaes", "CMA-ES", 40.0 if R == 32 else 20.0,
         _fleet_trace((0.0, 0, start), (2.0, 300, shift(2.0)), (10.0, 1500, late), (39.0, 6000, late))),
        ("tpe", "TPE (Optuna)", 20.0, _fleet_trace((0.0, 0, start), (19.0, 400, shift(3.0)))),
        ("random", "random search", 20.0, _fleet_trace((0.0, 0, start), (19.0, 2000, shift(4.0)))),
        ("hybrid", "hybrid (gradient + CMA-ES)", 20.0,
         _fleet_trace((2.0, 12, grad), (12.0, 900, shift(-0.2)))),
    ]
    return payload, [{"R": R, "method": m, "budget_s": b, "result": _fleet_result(n, tr)}
                     for m, n, b, tr in boxes]


def fleet_opt_artifact() -> dict:
    """The fleet_opt artifact merged from :func:`fleet_opt_jobs` at R = 8 and 32."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import fleet_opt

    jobs = [fleet_opt_jobs(R) for R in (8, 32)]
    payload = fleet_opt.merge_payload([g for g, _ in jobs], [b for _, bs in jobs for b in bs], FLEET_CFG)
    art = {**payload, "figure": "fleet_opt.png", "provenance": _prov("fleet_opt", FLEET_CFG)}
    return json.loads(json.dumps(art))


#: A point's optimum (``sensitivity.optimum``'s output): the calibrated model's least AoI inside the
#: grid, the uncalibrated one's at the grid's end.
OPTIMUM_FAR = {"kpi": "AoI", "p": [0.15, 0.3, 0.6],
               "L2": {"curve": [4.0, 3.5, 5.0], "best_p": 0.31, "inside": True, "at_best": 3.49},
               "models": {"L1D rb": {"curve": [6.0, 5.0, 4.0], "best_p": 0.6, "inside": False,
                                     "L2_at_best": 5.0, "L2_lost": 0.4327},
                          "L1D rb cal": {"curve": [4.2, 3.6, 5.5], "best_p": 0.28, "inside": True,
                                         "L2_at_best": 3.52, "L2_lost": 0.0086}}}


def sensitivity_artifact() -> dict:
    """A sensitivity artifact made by the stage's own ``merge`` from two synthetic points: one
    calibrated model agreeing with the FD, its uncalibrated self off by a factor 20 and with
    one wrong sign (d delay / d tx dB at the held-out point)."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import sensitivity

    params = {"level": "L2-legacy", "n_seeds": 4, "envs_per_seed": 2, "R": 8, "T": 60, "warmup": 10,
              "tau": 0.05, "lam": 0.1, "modes": ["L1"], "sends": ["rb"],
              "fd_steps": {"p": 0.05, "kbytes": 2.0, "tx_db": 1.0, "dist_m": 5.0},
              "ops": [{"name": "heavy", "p": 0.5, "sizes_bytes": [20000], "tx_dbm": 23.0,
                       "area_m": [40.0, 140.0]},
                      {"name": "far", "p": 0.3, "sizes_bytes": [12000], "tx_dbm": 23.0,
                       "area_m": [100.0, 200.0], "held_out": True}],
              "targets": {"models": ["L1D rb cal"], "sign_agree_min": 0.95, "median_ratio": [0.67, 1.5],
                          "within_x2_min": 0.75, "l1d_mf_sign_agree_min": 0.9}}
    parts = []
    for op in params["ops"]:
        rows = []
        for kpi in sensitivity.KPIS:
            for name in sensitivity.INPUTS:
                fd = 2.0 if kpi != "delivery_ratio" else 0.01
                resolved = kpi != "delivery_ratio"
                for cal in (False, True):
                    wrong = not cal and op["name"] == "far" and (kpi, name) == ("mean_delay", "tx_db")
                    ratio = 1.1 if cal else (-0.05 if wrong else 0.05)
                    verdict = ("fd_not_resolved" if not resolved else "sign_wrong" if wrong else "sign_ok")
                    label = f"d {sensitivity.KPI_LABEL[kpi]} / d {sensitivity.INPUT_LABEL[name]}"
                    rows.append({"op": op["name"], "held_out": op.get("held_out", False), "R": 8, "kpi": kpi,
                                 "fitted": kpi in sensitivity.FITTED_KPIS, "input": name, "derivative": label,
                                 "model": "L1D rb" + (" cal" if cal else ""), "mode": "L1", "sends": "rb",
                                 "calibrated": cal, "grad_mean": ratio * fd, "grad_std": 0.1, "fd_mean": fd,
                                 "fd_se": 0.2, "fd_significant": resolved,
                                 "sign_agree": (not wrong) if resolved else None, "verdict": verdict,
                                 "ratio": ratio, "ratio_lo": ratio - 0.3, "ratio_hi": ratio + 0.3,
                                 "ratio_within_x2": (0.5 <= ratio <= 2) if resolved else None,
                                 "ci": "bounded", "grad": [ratio * fd] * 4, "fd": [fd] * 4})
        parts.append({"op": op["name"], "rows": rows, "wall_l2_fd_s": 1.0, "wall_models_s": 0.5,
                      "values": {"op": op["name"], "held_out": op.get("held_out", False), "p": op["p"],
                                 "fd_step_p": 0.05, "R": 8, "sizes_bytes": op["sizes_bytes"],
                                 "tx_dbm": op["tx_dbm"], "area_m": op["area_m"],
                                 "L2": {"delay": 2.26, "delivery": 0.983, "AoI": 3.47, "energy": 1e-3},
                                 # the calibrated model's KPIs at one point only: the page's delay table
                                 # prints a dash where a point has none
                                 "models": ({"L1D rb cal": {"delay": 2.71, "delivery": 0.95, "AoI": 3.9,
                                                            "energy": 1e-3}}
                                            if op["name"] == "heavy" else {}),
                                 # where AoI is least in p at the held-out point only (the page's table
                                 # of least AoI lists the points that ask for it)
                                 **({"optimum": OPTIMUM_FAR} if op["name"] == "far" else {})}})
    payload = sensitivity.merge(params, parts, {("L1", "rb"): None})
    return json.loads(json.dumps({**payload, "provenance": _prov("sensitivity", params)}))


def calibration_artifact() -> dict:
    """A calibration artifact (the calibration file with its summary and table) with distinctive numbers."""
    cfg = {"seed": 7, "level": "L2-legacy", "R": [8, 16], "ref_R": 8, "area_m": [40.0, 140.0], "envs": 16,
           "model_robots": 32,
           "T": 60, "warmup": 10, "tau": 0.05, "lam": 0.1, "modes": ["L1"], "sends": ["relaxed"],
           "grid": {"p": [0.1, 0.8], "sizes_bytes": [6000, 30000], "tx_dbm": [23.0]},
           "heldout": {"p": [0.5], "sizes_bytes": [12000], "tx_dbm": [18.0]},
           "sweep": {"p": [0.2, 0.8], "sizes_bytes": [12000, 20000], "tx_dbm": [23.0]},
           "search": {"rate_factor": [0.5, 1.0], "snr_offset_db": [-4.0, 0.0], "sr_slots": {"L1": [0, 16]},
                      "tau": [0.05, 0.2], "qa_snr_req_db": [15.0, 5.0], "refine_top": 1, "refine_evals": 30,
                      "air_crowd_exp": [-0.5, 1.5], "air_evals": 30},
           "cell": {}}
    setup = {"loss_weights": {"mean_delay": 1.0, "mean_aoi": 1.0, "mean_energy_j": 0.5,
                              "delivery_ratio": 1.0},
             "delivery_unit": 0.1, "slope_weight": 1.0, "slope_pairs": 148,
             "evaluations": 38}
    row = {"model": "L1D relaxed", "mode": "L1", "sends": "relaxed", "R": 8, "train_points": 4,
           "heldout_points": 1, "model_envs": 4, "rate_factor": 0.508,
           "snr_offset_db": -2.63, "sr_field": "l1_sr_slots", "sr_slots": 16, "qa_snr_req_db": None,
           "tau": 0.2,
           "train_loss_uncalibrated": 18.1,
           "train_loss": 0.257,
           "heldout_loss_uncalibrated": 24.6, "heldout_loss": 0.222, "evaluations": 38, "wall_fit_s": 96.5,
           "sweep_loss_uncalibrated": 20.5, "sweep_loss": 0.31,
           "gradient_check": {"stable": True, "worst_error": 12.5, "kpi": "mean_delay",
                              "point": [0.8, 30000.0, 23.0], "autograd": -3.5, "fd": -2.25, "h": 0.02,
                              "max_error": 100.0, "kpi_floor": 0.1,
                              "rejected": [{"sr_slots": 24, "tau": 0.1, "rate_factor": 0.51,
                                            "snr_offset_db": -2.7,
                                            "train_loss": 0.25, "worst_error": 6.5e6, "kpi": "delivery_ratio",
                                            "point": [0.1, 6000.0, 23.0]}]}}
    forms = {"loss_own": 0.257, "loss_ref_constants": 0.257, "loss_line": None, "loss_interpolated": None,
             "fit_s": 55.0}
    fleet = [{**row, **forms},
             {**row, "R": 16, "train_points": 4, "model_envs": 2, "rate_factor": 0.397,
              "snr_offset_db": -3.4, "tau": 0.3, "train_loss": 0.318, "heldout_loss": 0.29, "loss_own": 0.318,
              "loss_ref_constants": 1.73, "loss_line": None, "loss_interpolated": None, "fit_s": 41.5,
              "air_factor": 1.9, "air_crowd_exp": 0.35,
              "air_fit": {"kept": True, "loss_without": 0.402, "loss": 0.318, "evaluations": 31}}]
    return {"format": "isaac_net.calibration", "version": 1, "calibrations": [{"mode": "L1", "setup": setup}],
            "summary": {"models": 1, "grid_points": 4, "heldout_points": 1, "envs_per_point": 16,
                        "model_envs_per_point": 4, "model_robots": 32, "R": 8, "fleet_sizes": 2, "R_min": 8,
                        "R_max": 16, "p_max": 0.95, "max_wall_fit_s": 96.5, "fit_target_s": 60.0, "T": 60,
                        "warmup": 10,
                        "tau": 0.05,
                        "lam": 0.1,
                        "area_lo_m": 40.0, "area_hi_m": 140.0, "all_improve_sweep": True, "sweep_points": 4,
                        "worst_heldout_loss": 0.222, "all_improve_heldout": True,
                        "all_gradients_stable": True, "floors_rejected": 1, "air_fits": 1, "air_kept": 1,
                        "air_basis_gap": 0.001},
            "table": [row], "fleet": fleet, "figure": "calibration.png",
            "provenance": _prov("calibration", cfg)}


def optimisation_artifact(name: str) -> dict:
    """An opt_rates / placement artifact: start, two gradient runs and the baselines, scored on L2-legacy."""
    cfg = {"seed": 7, "level": "L2-legacy", "lr": 0.1,
           "targets": {"solution": "gradient, L1D relaxed, calibrated", "start_envs_min": 0.95},
           "cost": {"weights": {"mean_delay": 1.0, "mean_aoi": 0.5, "mean_energy_j": 50.0},
                    "delivery_min": 0.95, "penalty": 100.0}}
    if name == "placement":
        cfg["move_weight"] = 0.01
    names = ["start", "gradient, L1D relaxed", "gradient, L1D relaxed, calibrated", "random search"]
    costs = {"start": 25.4, "gradient, L1D relaxed": 37.0, "gradient, L1D relaxed, calibrated": 3.09,
             "random search": 28.4}
    if name == "opt_rates":
        names.append("uniform policy")
        costs["uniform policy"] = 3.12
    table = [{"solution": n, "cost": costs[n], "cost_median": costs[n], "mean_delay": 1.5,
              "delivery_ratio": 0.995, "mean_aoi": 3.0, "mean_energy_j": 1e-3} for n in names]
    comps = []
    for n in ("gradient, L1D relaxed", "gradient, L1D relaxed, calibrated"):
        row = {"solution": n, "cost": costs[n], "delivery_ratio": 0.99}
        for base in ("start", "random search") + (("uniform policy",) if name == "opt_rates" else ()):
            key = base.replace(" ", "_")
            d = costs[n] - costs[base]
            row.update({f"vs_{key}_diff": d, f"vs_{key}_lo": d - 0.5, f"vs_{key}_hi": d + 0.5,
                        f"vs_{key}_better_envs": 1.0 if d < 0 else 0.0,
                        f"vs_{key}": "better" if d + 0.5 < 0 else "worse" if d - 0.5 > 0 else "tie"})
        comps.append(row)
    return {"summary": {"level": "L2-legacy", "E": 16, "R": 8, "iters": 50, "candidates": 256, "T": 20,
                        "T_eval": 60, "tau_start": 0.2, "tau_end": 0.02, "models": 2, "ci_pct": 95},
            "table": table, "comparisons": comps,
            "targets": {"solution": "gradient, L1D relaxed, calibrated", "available": True,
                        "start_envs_met": True, "met": True},
            "uniform_policy": ({"p": 0.3, "tx_dbm": 23.0, "train_cost": 3.0, "policies": 36}
                               if name == "opt_rates" else None),
            "history": {n: [{"iter": 0, "tau": 0.2, "model_cost": 5.0, "level_cost_heldout": 9.0}]
                        for n in names if n.startswith("gradient")},
            "env_costs": {n: [costs[n]] for n in names}, "figure": f"{name}.png",
            "provenance": _prov(name, cfg)}


def nn_proxy_artifact() -> dict:
    """A neural-proxy artifact with distinctive numbers."""
    summary = {"level": "L2-legacy", "train_cells": 640, "test_cells": 128, "robots": 8, "T": 60,
               "warmup": 10, "samples_train": 5120, "samples_test": 1024, "epochs": 300,
               "final_train_loss": 0.05, "grad_cells": 256, "grad_fd_significant": 12, "grad_sign_agree": 1.0,
               "grad_ratio_ci_covers_1": 0.833,
               "ratio_ci_pct": 95, "fd_step_p": 0.05, "fd_step_msg_rel": 0.1, "fd_step_snr_db": 1.0,
               "reload_max_abs_diff": 0.0}
    for k, r2 in (("delay", 0.908), ("delivery", 0.912), ("aoi", 0.854), ("energy_j", 0.963)):
        summary.update({f"heldout_r2_{k}": r2, f"heldout_mean_rel_err_{k}": 0.1, f"train_r2_{k}": r2 + 0.01})
    row = {"derivative": "d energy / d kB", "cells": 256, "proxy": 1.2e-5, "fd_mean": 2.6e-5, "fd_se": 1e-6,
           "fd_significant": True, "sign_agree": True, "ratio": 0.473, "ratio_lo": 0.216, "ratio_hi": 0.879,
           "ci": "bounded", "corr_over_cells": 0.659}
    return {"summary": summary, "table": [row], "ranges": {"p": [0.05, 0.95], "msg_bytes": [2000.0, 40000.0],
                                                          "snr_db": [5.0, 35.0]},
            "figure": "nn_proxy.png", "provenance": _prov("nn_proxy", {"seed": 7, "hidden": [64, 64]})}


# The gpu stage (benchmarks/diff/gpu.py): a small device check, two levels at two batch sizes.
GPU_TESTS_LOG = ("........................ [100%]\n=== warnings summary ===\n"
                 "24 passed, 402 deselected, 16 warnings in 93.44s (0:01:33)\n")


def gpu_measured(**change) -> dict:
    def discrete(model, variant, E, rate, graphs=None):
        return {"kind": "discrete", "model": model, "variant": variant, "E": E, "R": 8, "steps": 21,
                "s_per_step": E / rate, "cell_steps_per_s": rate, "first_steps": 21, "first_steps_s": 9.5,
                "graphs": graphs, "books_balanced": True, "delivered_share": 0.96, "error": None,
                "peak_mib": 27.0}

    def diff(model, variant, E, rate):
        return {"kind": "diff", "model": model, "variant": variant, "E": E, "R": 8, "steps": 60,
                "s_per_step": E / rate, "cell_steps_per_s": rate, "first_steps": 60, "first_steps_s": 37.3,
                "fwd_bwd_s": 60 * E / rate, "slots": "recompute", "grad_finite": True, "error": None,
                "peak_mib": 300.0}

    rows = [discrete("L2-legacy", "eager", 16, 177.0), discrete("L2-legacy", "cuda_graph", 16, 919.0, 21),
            discrete("L2-legacy", "eager", 16384, 150_600.0),
            discrete("L2-legacy", "cuda_graph", 16384, 253_200.0, 21),
            diff("L1D", "eager", 16384, 246_500.0), diff("L1D", "compiled", 16384, 1_820_000.0)]
    return {"commit": "31b0355", "date_utc": "2026-12-04T16:43:58Z", "device": "NVIDIA H200",
            "torch": "2.11.0+cu130", "cuda": "13.0", "R": 8, "rows": rows, "skipped": [], "wall_s": 185.8,
            **change}


def gpu_artifact(measured: dict | None = None, log: str = GPU_TESTS_LOG) -> dict:
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import gpu

    expect = {"E_max": 16384, "discrete": ["L2-legacy"], "discrete_variants": ["eager", "cuda_graph"],
              "relaxed": ["L1D", "QAD"], "relaxed_variants": ["eager", "compiled"]}
    data = gpu.artifact(measured or gpu_measured(), log, expect)
    return {**data, "figure": "gpu.png", "provenance": _prov("gpu", {"expect": expect})}


def study_artifact(name: str) -> dict:
    """The artifact of a study, with a figure (the generic structure where the page has no section of its
    own)."""
    if name in ("opt_rates", "placement"):
        return optimisation_artifact(name)
    if name == "gpu":
        return gpu_artifact()
    if name == "sensitivity":
        return {**sensitivity_artifact(), "figure": "sensitivity.png"}
    if name == "nn_proxy":
        return nn_proxy_artifact()
    return {"summary": {"score": 5.46}, "table": [{"case": "a", "value": 15.4}], "figure": f"{name}.png",
            "provenance": _prov(name, {"seed": 7})}


FIGURES = ("convergence_curves.png", "fd_check.png", "calibration.png", "opt_rates.png", "fleet_opt.png",
           "gpu.png")


def write_artifacts(folder: Path, artifacts: dict) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:
        (folder / name).write_bytes(b"\x89PNG fixture")
    paths = {}
    for name in render.STAGES:
        paths[name] = str(folder / f"{name}.json")
        if name in artifacts:
            Path(paths[name]).write_text(json.dumps(artifacts[name]))
    return paths


def build_page(tmp_path: Path, artifacts: dict) -> str:
    paths = write_artifacts(tmp_path / "results", artifacts)
    pending = {name: f"snakemake --cores 32 {p}" for name, p in paths.items()}
    page = tmp_path / "page"
    return render.build(paths, pending, "fixture", page / "page.md", page / "figures")


def section(page: str, heading: str) -> str:
    """The text under one heading, up to the next heading of any level."""
    start = page.index(heading + "\n")
    nxt = re.search(r"^#", page[start + len(heading):], re.M)
    return page[start:start + len(heading) + nxt.start()] if nxt else page[start:]


# ------------------------------------------------------------------------------ the gpu stage
def test_gpu_stage_derives_the_ratios_and_names_what_is_missing():
    data = gpu_artifact()
    s, rows = data["summary"], {(r["model"], r["variant"], r["E"]): r for r in data["table"]}
    assert rows[("L2-legacy", "cuda_graph", 16)]["speedup_vs_eager"] == pytest.approx(919.0 / 177.0)
    assert rows[("L1D", "compiled", 16384)]["speedup_vs_eager"] == pytest.approx(1_820_000.0 / 246_500.0)
    assert rows[("L2-legacy", "eager", 16)]["speedup_vs_eager"] is None
    assert s["missing"] == "QAD eager, QAD compiled" and not s["complete"]
    assert (s["tests_passed"], s["tests_failed"], s["tests_ok"]) == (24, 0, True)
    assert s["l2_graphs"] == 21 and s["books_balanced"] and s["grads_finite"]
    bad = gpu_artifact(log="2 failed, 22 passed, 1 error in 9.10s\n")["summary"]
    assert (bad["tests_passed"], bad["tests_failed"], bad["tests_errors"]) == (22, 2, 1)
    assert not bad["tests_ok"]
    assert gpu_artifact(log="Killed\n")["summary"]["tests_line"] is None


def test_gpu_section_shows_the_rows_ratios_and_failures(tmp_path):
    page = build_page(tmp_path, fixture_artifacts() | {"gpu": gpu_artifact()})
    sec = section(page, "## On a GPU (CUDA rows)")
    assert "(NVIDIA H200, torch `2.11.0+cu130`, CUDA `13.0`, at commit `31b0355`" in sec
    assert "24 passed, none failed" in sec
    assert "| L2-legacy | cuda_graph | 16 | 919 | 5.19× |" in sec
    assert ("L2-legacy as `cuda_graph` against its eager step on the GPU: 5.19× at E = 16, 1.68× at "
            "E = 16384") in sec
    assert "**Missing at E = 16384: QAD eager, QAD compiled**" in sec
    assert "Against the CPU" not in sec  # the cost artifact has no numba rows
    arts = fixture_artifacts()
    arts["cost"]["l2_backends"] = [
        {"E": E, "numba_cell_steps_per_s": rate, "eager_cell_steps_per_s": 600.0, "speedup": rate / 600.0,
         "target_speedup": None, "target_met": None}
        for E, rate in ((256, 23_900.0), (16, 11_700.0))]
    arts["cost"]["l2_first_calls"] = None
    sec = section(build_page(tmp_path / "cpu", arts | {"gpu": gpu_artifact()}), "## On a GPU (CUDA rows)")
    assert ("numba slot loop steps 23900 cell-steps/s at E = 256, its largest batch there; the GPU's "
            "`cuda_graph` 253200 at E = 16384, 10.6× that.") in sec
    measured = gpu_measured()
    measured["rows"][1] = {"kind": "discrete", "model": "L2-legacy", "variant": "cuda_graph", "E": 16, "R": 8,
                           "error": "RuntimeError: operation not permitted when stream is capturing",
                           "peak_mib": 1.0}
    page = build_page(tmp_path / "failed", fixture_artifacts() | {
        "gpu": gpu_artifact(measured, log="1 failed, 23 passed in 90.0s\n")})
    sec = section(page, "## On a GPU (CUDA rows)")
    assert "| L2-legacy | cuda_graph | 16 | failed: `RuntimeError: operation not permitted" in sec
    assert "**1 failed, 0 errors**" in sec and "**1 row(s) failed**" in sec


# ------------------------------------------------------------------------------ rendering
def test_sensitivity_page_splits_an_aoi_sign_miss_into_the_delay_slope_and_the_age_term(tmp_path):
    """A calibrated d AoI / d p of the wrong sign is stated as d delay / d p less an age term, for
    the level and the model, from the same point's d delay / d p row."""
    arts = fixture_artifacts()
    rows = {(r["op"], r["model"], r["kpi"], r["input"]): r for r in arts["sensitivity"]["rows"]}
    aoi, delay = rows[("far", "L1D rb cal", "mean_aoi", "p")], rows[("far", "L1D rb cal", "mean_delay", "p")]
    aoi.update(fd_mean=-3.0, grad_mean=2.0, sign_agree=False, verdict="sign_wrong", ratio=-0.667)
    delay.update(fd_mean=10.0, grad_mean=18.0, ratio=1.8)
    # a calibrated sign miss of another derivative, listed but not split
    rows[("far", "L1D rb cal", "mean_delay", "tx_db")].update(grad_mean=-2.2, sign_agree=False,
                                                              verdict="sign_wrong", ratio=-1.1)
    text = section(build_page(tmp_path, arts), "## Sensitivity against L2-legacy")
    assert ("- L1D rb cal at far: L2-legacy's d AoI / d p, -3, is its d delay / d p, 10, less 13; the "
            "model's d delay / d p is 18 (1.8 times L2-legacy's) against an age term of 16, so its d AoI / "
            "d p is 2.") in text
    assert "L1D rb cal at far, d delay / d tx dB (model -2.2 against FD 2)" in text
    assert text.count("against an age term") == 1


def test_sensitivity_page_tabulates_where_each_model_puts_the_least_aoi_and_what_following_it_costs(tmp_path):
    """The table of least AoI lists the points that ask for it (not the others), L2-legacy's p and each
    calibrated model's with what following it gives up on L2-legacy, in percent; a p at the grid's end
    is marked."""
    arts = fixture_artifacts()
    text = section(build_page(tmp_path, arts), "## Sensitivity against L2-legacy")
    assert "| far | 8 | 0.3 | 0.31 | 0.28 (0.86 %) |" in text
    assert "| heavy | 8 | 0.5 |" not in text
    assert "the point's p times each of 3 factors" in text
    assert "A share below zero" not in text
    far = next(v for v in arts["sensitivity"]["values"] if v["op"] == "far")
    far["optimum"]["models"]["L1D rb cal"].update(best_p=0.6, inside=False, L2_lost=0.43)
    text = section(build_page(tmp_path / "end", arts), "## Sensitivity against L2-legacy")
    assert "| far | 8 | 0.3 | 0.31 | 0.6 (end) (43 %) |" in text
    far["optimum"]["models"]["L1D rb cal"].update(L2_lost=-0.0034)
    text = section(build_page(tmp_path / "below", arts), "## Sensitivity against L2-legacy")
    assert "(-0.34 %) |" in text and "A share below zero: L2-legacy's AoI at the model's p" in text


def test_sensitivity_metrics_count_a_row_without_an_interval_as_not_covering_one():
    """A resolved row whose model gradient is the same in every replicate (zero at a saturated point)
    has no bootstrap interval: NaN, written as null; it does not cover 1 and breaks nothing."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import sensitivity

    def row(lo, hi, ratio):
        return {"fd_significant": True, "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
                "sign_agree": ratio > 0, "ratio_within_x2": 0.5 <= ratio <= 2.0}

    nan = float("nan")
    got = sensitivity._metrics([row(0.8, 1.2, 1.0), row(None, None, -0.0), row(nan, nan, 0.0),
                                row(2.5, 3.5, 3.0)])
    assert got["resolved_rows"] == 4 and got["ci_covers_1_frac"] == 0.25
    assert got["sign_agree_frac"] == 0.5 and got["within_x2_frac"] == 0.25


def test_sensitivity_merge_reads_a_parts_null_interval_back_as_nan(tmp_path):
    """The artifact writes a non-finite interval as null; the merge (and its figure) reads it as NaN."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import sensitivity

    path = tmp_path / "op.json"
    path.write_text(json.dumps({"op": "x", "rows": [{"ratio": -0.0, "ratio_lo": None, "ratio_hi": None},
                                                    {"ratio": 1.0, "ratio_lo": 0.5, "ratio_hi": 2.0}]}))
    rows = sensitivity._read_part(str(path))["rows"]
    assert math.isnan(rows[0]["ratio_lo"]) and math.isnan(rows[0]["ratio_hi"]) and rows[0]["ratio"] == 0.0
    assert (rows[1]["ratio_lo"], rows[1]["ratio_hi"]) == (0.5, 2.0)


def test_sensitivity_bar_checks_each_model_at_each_size_and_names_what_misses(tmp_path):
    """The fleet-size issue's bar: per model and fleet size, that size's point group's sign
    agreement and median ratio against their thresholds; a size without points does not hold it."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import sensitivity

    bar_cfg = {"R": [32, 64], "models": ["QAD rb cal", "L1D rb cal"], "sign_agree_min": 0.9,
               "median_ratio": [0.5, 2.0]}
    metrics = [{"model": "QAD rb cal", "points": "R32", "R": 32, "resolved_rows": 16, "sign_agree_frac": 1.0,
                "median_ratio": 0.8},
               {"model": "QAD rb cal", "points": "R64", "R": 64, "resolved_rows": 16,
                "sign_agree_frac": 0.875, "median_ratio": 0.45},
               {"model": "L1D rb cal", "points": "R32", "R": 32, "resolved_rows": 16, "sign_agree_frac": 0.9,
                "median_ratio": 2.0},
               {"model": "L1D rb cal", "points": "held_out", "resolved_rows": 40, "sign_agree_frac": 1.0,
                "median_ratio": 1.0}]
    bar = sensitivity._bar(bar_cfg, metrics)
    got = {(b["model"], b["R"]): (b["measured"], b["sign_met"], b["median_met"], b["met"]) for b in bar}
    assert got == {("QAD rb cal", 32): (True, True, True, True),
                   ("QAD rb cal", 64): (True, False, False, False),
                   ("L1D rb cal", 32): (True, True, True, True),  # the bounds count as met
                   ("L1D rb cal", 64): (False, False, False, False)}  # no R = 64 points: not held
    assert sensitivity._bar(None, metrics) == []

    arts = fixture_artifacts()
    arts["sensitivity"]["bar"] = bar
    arts["sensitivity"]["provenance"]["config"]["bar"] = bar_cfg
    text = section(build_page(tmp_path / "miss", arts), "## Sensitivity against L2-legacy")
    assert ("at points of R = 32 and 64 robots per cell that no fit used (loads near each size's knee), the "
            "gradients of QAD rb cal and L1D rb cal agree with the finite differences in sign (at least 0.9 "
            "of the resolved rows) and in size (median ratio in [0.5, 2]): **it does not hold** (QAD rb cal "
            "at R = 64: sign agreement 0.875, median ratio 0.45; L1D rb cal at R = 64: not measured).") \
        in text
    arts["sensitivity"]["bar"] = [b for b in bar if b["met"]]
    text = section(build_page(tmp_path / "holds", arts), "## Sensitivity against L2-legacy")
    assert "in size (median ratio in [0.5, 2]): it holds (sign agreement 0.9–1, median ratios 0.8–2)." in text
    assert "it does not hold" not in text


def test_sensitivity_section_tabulates_each_calibrated_models_delay_beside_l2_legacys(tmp_path):
    """The delay table (the sensitivity stage's ``values``: L2-legacy's and each calibrated model's mean
    delay at each point): one row per point, a column per calibrated model, a dash where a point
    recorded no value for it."""
    sens = section(build_page(tmp_path, fixture_artifacts()), "## Sensitivity against L2-legacy")
    assert "| point | robots per cell | L2-legacy | L1D rb cal | " in sens
    assert "| heavy | 8 | 2.26 | 2.71 | " in sens
    assert "| far | 8 | 2.26 | – | " in sens


def test_numbers_land_in_their_sections(tmp_path):
    page = build_page(tmp_path, fixture_artifacts())
    eq = section(page, "## Equivalence at tau = 0")
    assert "max difference 0 at 1e-4 tolerance" in eq
    assert "per-robot delay sums within 3.3e-16 relative" in eq
    assert "case `overload` with L1D vs L1 (23 timeouts and 17 overflows of 137 offered messages); case" in eq
    assert "E = 8, R = 6, T = 50" in eq

    conv = section(page, "## Convergence as tau → 0")
    assert "Discrete mean delay: 0.382 control steps (L1) and 0.638 (QA)." in conv
    assert "| discrete | 0.382 | 2.501 | | 0.638 | 2.725 | | |" in conv
    assert "| 0.05 | 0.411 | 2.576 | 7.5 % | 0.686 | 2.807 | 7.5 % |" in conv
    assert "falls roughly linearly in tau for L1D (fitted log-log slope 1)" in conv
    assert "at most 7.5 % at tau = 0.05 and at most 0.3 % at tau = 0.002" in conv
    assert "biases the mean delay upward in L1D and upward in QAD at every tau of the table." in conv

    curves = section(page, "### Convergence curves")
    assert "E = 64, R = 8, T = 200 and loads p = 0.2, 0.4 and 0.6:" in curves
    assert "![mean delay vs tau, relaxed and discrete](figures/convergence_curves.png)" in curves
    assert (tmp_path / "page" / "figures" / "convergence_curves.png").exists()

    grad = section(page, "## Gradient correctness")
    assert "passes in float64" in grad and "32 of 32 checks, 29 of them with a nonzero gradient" in grad
    assert "E = 2, R = 3, T = 4, K = 4, F = 3" in grad
    fd = section(page, "### Finite differences at scale")
    assert "E = 32, R = 8, T = 60, K = 40" in fd
    assert "better than 1.7e-6 relative for every input (tolerance 1e-4)" in fd
    assert "shrinks roughly quadratically with the step" in fd
    assert "worst 0.017 at step 0.01, 3.9e-6 at step 1e-5" in fd
    assert "Signs are physical" in fd

    cost = section(page, "## Cost")
    assert ("- QAD at E = 1024, one thread, forward + backward: its fused rollout node eager 0.19 s, with "
            "its forward compiled (`compile=True` on the CPU) 0.28 s (eager 1.47× faster).") in cost
    assert "| L1D | eager | cpu | 16 | 60 | 1 | 0.4 | 0.5 | – | 345 | 24.3× |" in cost
    assert "| L1D | eager | cpu | 1024 | 200 | 1 | 21 | 24.8 | – | 3310 | – |" in cost
    assert ("per-slot autograd 1.8 s, eager 0.9 s (2× faster), "
            "compiled 0.12 s (15× faster; the bar is 7×: met)") in cost
    assert "recomputes the rest in the backward): forward 21 s, backward 24.8 s" in cost
    assert "No CUDA device was visible to this run" in cost
    assert "| L1D | compiled | 16 | 0.1 | 0.12 | **not met** |" in cost
    # the warm-up row and its targets
    assert "| L1D | 55 | 47.5 | 0.31 | 153 | 6.8 | 4.4 | 71 / 61 / 9 | met | **not met** |" in cost
    assert ("- L1D's cold first call took 47.5 s, 153 steady rollouts: both cold targets met; the warm one "
            "took 6.8 s against 5 s: **not met**; 4.4 s of it is importing torch's compiler") in cost
    assert ("On a fresh machine, where inductor also builds its precompiled header, the first call took "
            "55 s. At E = 16, `compile=True` pays for itself after 9 rollouts with a warm cache (61 cold, "
            "71 on a fresh machine): its steady rollout takes 0.12 s against 0.9 s eager.") in cost
    # a compiled rollout slower than eager never pays, and a missed ratio says which target missed
    assert "| QAD | 20 | 10.5 | 0.025 | 420 | 2.4 | 1 | never | **not met** | met |" in cost
    assert "the seconds met, the ratio missed" in cost
    assert ("At E = 16, `compile=True` never pays for itself: its steady rollout takes 0.036 s against "
            "0.03 s eager.") in cost
    assert "failed: `timed out after 900 s`" in cost
    assert "L2-legacy: not available (`ModuleNotFoundError: no l2_legacy`)" in cost

    sens = section(page, "## Sensitivity against L2-legacy")
    # agreement over the four fitted KPIs x four inputs (throughput's rows apart); delivery's (8) not resolved
    assert not re.search(r"^- \w+: ", page, re.M), "a key: value bullet on the page"
    assert "| L1D rb | stage | 12 | 1 | 0.05 | 0 | 0 |" in sens
    assert "| L1D rb cal | held out | 12 | 1 | 1.1 | 1 | 1 |" in sens
    assert "| L1D rb | held out | 12 | 0.917 | 0.05 | 0 | 0 |" in sens
    assert "Throughput (B/s; a KPI the calibration does not fit" in sens
    assert "| L1D rb | held out | 4 | 1 | 0.05 | 0 | 0 |" in sens
    assert "- L1D rb cal, held-out points: met." in sens
    assert "So, by this measure, the gradients of L1D rb cal carry over to L2-legacy in sign and size." \
        in sens
    assert "Without calibration 1 model rows disagree in sign with L2-legacy; with it 0 do." in sens
    assert "| far | d delay / d tx dB | 2 ± 0.2 | ✗ -0.05 [-0.35, 0.25] | 1.1 [0.8, 1.4] |" in sens
    assert "8 of 40 derivatives are not resolved" in sens
    assert "_Provenance (sensitivity): profile `fixture`" in sens
    assert "load average 0.25 at the start and 0.75 at the end, wall time 12.5 s" in sens

    cal = section(page, "## Calibration to L2-legacy")
    assert ("| L1D relaxed | 0.508 | -2.63 | 16 (`l1_sr_slots`) | – | 0.2 | 18.1 | 0.257 | 24.6 | 0.222 | "
            "38 | passed (12.5) |") in cal
    assert "uncalibrated at tau = 0.05 (the studies' temperature)" in cal
    assert ("× 2 latency floors × 2 temperatures (tau = 0.05 and 0.2), for QAD × 2 headroom requirements "
            "(15 and 5 dB), each choice of floor, temperature and requirement one batched rollout; "
            "then") in cal
    assert ('then `net = cal.model(E, R)`, the same as `DiffFluid(E, R, mode="L1", tau=cal.at(R).tau, '
            'cfg=cal.apply(CellConfig(), R=R))`') in cal
    assert ("| L1D relaxed | 16 | 4 | 0.397 | -3.4 | 16 | – | 0.3 | 1.9 | 0.35 | 18.1 | 0.318 | 1.73 | – "
            "| – | 24.6 | 0.29 |") in cal
    assert "| 0.508 | -2.63 | 16 | – | 0.2 | – | – | 18.1 | 0.257 |" in cal  # R = 8: an entry without them
    assert ("within [-0.5, 1.5], at most 30 evaluations of that energy, from no crowd exponent and the "
            "factor that brings the energy to L2-legacy's there; the constants it finds then run once "
            "through the model, whose loss is the one kept and reported (the search's loss and the "
            "model's differ by at most 0.001 of the loss over the fits). They are kept where they lower "
            "the training loss and the gradient check still passes: at 1 of 1 fits. The training loss "
            "without them and with them: L1D relaxed at R = 16 0.402 → 0.318.") in cal
    assert "L1D relaxed at R = 8 55 s; L1D relaxed at R = 16 41.5 s." in cal
    assert ("At R = 16 the constants of R = 8 give training losses of 1.73–1.73 against 0.318–0.318 of the "
            "size's own fit.") in cal
    assert ("(half step 0.02 in p, on the same sends) and takes the error |autograd − FD| / "
            "(|FD| + 0.1 |KPI|); at most 100 passes.") in cal
    assert ("Set aside by the check: L1D relaxed with a floor of 24 slots at tau = 0.1 (training loss 0.25, "
            "lower than the kept one's; worst error 6.5e6, in d delivery / d p at p = 0.1, 6000 bytes, "
            "23 dBm).") in cal
    assert "No floor of" not in cal
    assert ("Fit times on one core (every size of a model, one job): L1D relaxed 96.5 s. The target is "
            "each model's fit, every size together, within 1 min on one core: **not met**, the slowest "
            "model's fit takes 1.61 min.") in cal
    assert "Every model's held-out loss falls with its calibration" in cal
    assert ("the mean point loss (the level term) is 20.5 → 0.31 for L1D relaxed: every calibrated "
            "model is") in cal
    assert ("averaged over the points, and, weighted 1, a slope term: the same weighted squares of the "
            "errors' *changes* between neighbouring points, averaged over 148 pairs") in cal
    opt = section(page, "## Optimization demo")
    assert "| gradient, L1D relaxed, calibrated | 3.09 | 3.09 |" in opt
    assert ("- Through L1D relaxed: **worse than** the start (optimising through this model made the "
            "L2-legacy cost worse)") in opt
    assert ("- Through L1D relaxed, calibrated: better than the start; better than random search on "
            "L2-legacy; no worse than (within the interval) the best uniform policy.") in opt
    assert "better than the start in at least 0.95 of the envs (met)" in opt
    assert "p = 0.3 and 23 dBm won" in opt

    guide = section(page, "## Temperature guidance")
    assert "tau = 0.05 is a reasonable default" in guide and "7.5 % (L1D)" in guide
    assert "the gradcheck stage uses 1e-6 in float64" in guide
    assert "the K = 40 UL slots" in section(page, "## Limits")
    trace = json.loads((tmp_path / "page" / "page.trace.json").read_text())
    assert check_numbers.check_page(page, trace) == []
    keys = {e["key"] for e in trace["numbers"]}
    assert {"sensitivity.metrics[0].median_ratio", "convergence.summary.L1_discrete_delay",
            "cost.table[0].forward_s", "(gradcheck.summary.num_checks - gradcheck.summary.num_pass)"} & keys
    assert "convergence.summary.L1_discrete_delay" in keys and "cost.table[0].forward_s" in keys


def test_fleet_opt_merge_says_when_the_hybrid_had_no_solution_by_its_budget(tmp_path):
    """A hybrid whose first trace row came after its whole budget (10 t = 20 s; its start and first
    generation took longer, as on a loaded box) is not measured charged in full, and says why,
    where the merge used to fail on the missing solution."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import fleet_opt

    grad, boxes = fleet_opt_jobs(32)
    hyb = next(b for b in boxes if b["method"] == "hybrid")
    hyb["result"] = _fleet_result("hybrid (gradient + CMA-ES)", _fleet_trace((21.0, 900, [2.0] * 4)))
    payload = fleet_opt.merge_payload([grad], boxes, FLEET_CFG)
    charged = {(c["method"], c["baseline"]): c for c in payload["charged"]}
    c = charged["hybrid (gradient + CMA-ES)", "CMA-ES"]  # CMA-ES ran 40 s, the total 20 + 20 s
    assert c["covered"] and not c["measured"] and c["unrecorded"] == "hybrid (gradient + CMA-ES)"
    assert "diff" not in c
    g = charged["gradient (chosen model)", "CMA-ES"]
    assert g["measured"] and g["diff"] == pytest.approx(-2.0)
    assert payload["targets"]["charged"] == [{"R": 32, "met": True}]  # the gradient's row still counts
    art = {**payload, "figure": "fleet_opt.png", "provenance": _prov("fleet_opt", FLEET_CFG)}
    page = build_page(tmp_path, fixture_artifacts() | {"fleet_opt": json.loads(json.dumps(art))})
    text = section(page, "## Gradients against black-box optimisers on L2-legacy")
    assert ("plus the calibration (20 s) against CMA-ES given the same 40 s: not measured (hybrid "
            "(gradient + CMA-ES) had recorded no solution by 20 s).") in text


def test_fleet_opt_merge_slices_the_traces_at_the_budgets_and_pairs_the_cells():
    art = fleet_opt_artifact()
    row = {(r["R"], r["budget_factor"], r["method"]): r for r in art["table"]}
    # CMA-ES at R = 8: at 1 t (2 s) its row of 2 s, at 3 t (6 s) still it, at 10 t (20 s) the 10 s row.
    assert row[8, 1, "CMA-ES"]["wall_s"] == 2.0 and row[8, 3, "CMA-ES"]["wall_s"] == 2.0
    assert row[8, 10, "CMA-ES"]["wall_s"] == 10.0 and row[8, 10, "CMA-ES"]["cost"] == pytest.approx(2.05)
    assert row[8, 1, "TPE (Optuna)"]["cost"] == pytest.approx(8.05)  # its 19 s row is past 2 s: the start
    assert row[8, 1, "hybrid (gradient + CMA-ES)"]["wall_s"] == 2.0  # starts where the gradient ended
    assert row[8, 10, "gradient (chosen model)"]["rollouts"] == 12  # charged for the choice among models
    comp = {(c["R"], c["budget_factor"], c["method"], c["baseline"]): c for c in art["comparisons"]}
    c = comp[8, 10, "gradient (chosen model)", "CMA-ES"]
    assert c["diff"] == pytest.approx(1.0) and c["lo"] > 0 and c["verdict"] == "worse"
    assert c["better_cells"] == 0
    c = comp[32, 10, "gradient (chosen model)", "TPE (Optuna)"]
    assert c["diff"] == pytest.approx(-3.0) and c["hi"] < 0 and c["better_cells"] == 1
    charged = {(c["R"], c["method"], c["baseline"]): c for c in art["charged"]}
    assert not charged[8, "gradient (chosen model)", "CMA-ES"]["covered"]  # CMA-ES ran 20 s of the 22
    c = charged[32, "gradient (chosen model)", "CMA-ES"]
    assert c["covered"] and c["total_s"] == 22.0 and c["diff"] == pytest.approx(-2.0)
    even = {(e["R"], e["baseline"]): e for e in art["break_even"]}
    assert even[8, "CMA-ES"]["reached_s"] == 10.0 and even[8, "CMA-ES"]["slack_s"] == 8.0
    assert even[8, "CMA-ES"]["fleets_to_amortise"] == 3  # 20 s of calibration over 8 s a run
    assert even[32, "CMA-ES"]["reached_s"] is None and even[32, "CMA-ES"]["pays_in_one_run"]
    sizes = {z["R"]: z for z in art["sizes"]}
    assert sizes[8]["uniform"]["method"] == "CMA-ES" and sizes[8]["uniform"]["clearly_worse"]
    assert sizes[32]["uniform"]["method"] == "hybrid (gradient + CMA-ES)"
    # the proxy (not a candidate) competes: at R = 8 it wins at 1 t and 3 t, CMA-ES at 10 t
    assert [w["method"] for w in sizes[8]["winners"]] == ["gradient, neural proxy"] * 2 + ["CMA-ES"]
    assert art["targets"]["amortised"] == [{"R": 32, "met": True}] and art["targets"]["met"] is True
    # Each model at its own wall time: L1D (5 s) against CMA-ES at 3 x 5 s (its 10 s row); its job
    # (20 s) did not run 10 x 5 s.
    l1 = next(m for m in sizes[8]["gradients"] if "L1D" in m["method"])
    assert not l1["candidate"] and l1["calibration_s"] == 30.0
    own = {(r["budget_factor"], r["baseline"]): r for r in l1["own_time"]}
    assert own[3, "CMA-ES"]["covered"] and own[3, "CMA-ES"]["baseline_cost"] == pytest.approx(2.05)
    assert own[3, "CMA-ES"]["diff"] == pytest.approx(1.5) and own[3, "CMA-ES"]["verdict"] == "worse"
    assert not own[10, "CMA-ES"]["covered"] and "diff" not in own[10, "CMA-ES"]
    # The proxy, its fit charged: 0.5 s + 3 s against CMA-ES at 3.5 s (its 2 s row, 5.05).
    px = next(m for m in sizes[8]["gradients"] if m["method"] == "gradient, neural proxy")
    assert px["proxy"] and px["cost"] == pytest.approx(2.55)
    ch = {r["baseline"]: r for r in px["charged"]}
    assert ch["CMA-ES"]["total_s"] == 3.5 and ch["CMA-ES"]["baseline_cost"] == pytest.approx(5.05)
    assert ch["CMA-ES"]["diff"] == pytest.approx(-2.5) and ch["CMA-ES"]["verdict"] == "better"


def test_fleet_opt_targets_are_unmeasured_without_their_size_and_unmet_when_a_baseline_wins():
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import fleet_opt

    jobs = [fleet_opt_jobs(8)]
    cfg = copy.deepcopy(FLEET_CFG)
    cfg["targets"] |= {"amortised_R": [8, 64], "charged_R": [64]}
    art = fleet_opt.merge_payload([jobs[0][0]], jobs[0][1], cfg)
    assert art["targets"]["amortised"] == [{"R": 8, "met": False}, {"R": 64, "met": None}]
    assert art["targets"]["met"] is None and art["targets"]["measured"] == 1
    # A black-box job that ended before a budget has no solution there, not its last one.
    grad, boxes = fleet_opt_jobs(8)
    next(b for b in boxes if b["method"] == "tpe")["budget_s"] = 10.0
    art = fleet_opt.merge_payload([grad], boxes, FLEET_CFG)
    row = {(r["budget_factor"], r["method"]): r for r in art["table"]}
    assert row[3, "TPE (Optuna)"]["ran"] and row[3, "TPE (Optuna)"]["cost"] == pytest.approx(8.05)
    assert not row[10, "TPE (Optuna)"]["ran"] and row[10, "TPE (Optuna)"]["cost"] is None
    assert not any(c["baseline"] == "TPE (Optuna)" and c["budget_factor"] == 10 for c in art["comparisons"])


def test_fleet_opt_candidates_are_the_models_entries_of_choose_from():
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import fleet_opt

    assert fleet_opt.candidates(FLEET_CFG) == FLEET_CFG["models"][1:]  # their own settings kept
    assert fleet_opt.candidates({"models": FLEET_CFG["models"]}) == FLEET_CFG["models"]  # default: all
    with pytest.raises(ValueError, match="choose_from: expected a non-empty subset of models"):
        fleet_opt.candidates({**FLEET_CFG, "choose_from": [{"mode": "L1", "sends": "mean_field"}]})


def test_fleet_opt_methods_cover_the_gradient_charged_in_full_where_asked(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import fleet_opt
    from _fleet_budget import covers_calibration

    grad = {"R": 32, "t_grad_s": 2.0, "calibration_cost": {"total_s": 50.0}}

    def job(payload, name="gradient_R32.json"):
        (tmp_path / name).write_text(json.dumps(payload))
        return str(tmp_path / name)

    unread = str(tmp_path / "absent.json")  # a covered job that read it would fail to open it
    assert fleet_opt.blackbox_budget(FLEET_CFG, 32, "tpe", job(grad)) == (20.0, grad)  # 10 t
    # a fixed wall time from the start, whatever the gradient job measured (it is not read)
    assert covers_calibration(FLEET_CFG, 32, "cmaes") and covers_calibration(FLEET_CFG, "32", "cmaes")
    assert fleet_opt.blackbox_budget(FLEET_CFG, 32, "cmaes", unread) == (40.0, None)
    assert not covers_calibration(FLEET_CFG, 8, "cmaes")  # not a covered size
    assert fleet_opt.blackbox_budget(FLEET_CFG, 8, "cmaes", job({**grad, "R": 8}))[0] == 20.0
    both = {**FLEET_CFG, "cover_calibration_methods": ["cmaes", "tpe"]}
    assert fleet_opt.blackbox_budget(both, 32, "tpe", unread) == (40.0, None)  # TPE asked too
    assert fleet_opt.blackbox_budget(both, 32, "random", job(grad))[0] == 20.0  # not asked
    with pytest.raises(ValueError, match="R32.json: the gradient job of R = 32 sets random's budget"):
        fleet_opt.blackbox_budget(both, 32, "random", job(None))
    with pytest.raises(ValueError, match="gradient_R8.json: expected the gradient job of R = 32, got R = 8"):
        fleet_opt.blackbox_budget(both, 32, "random", job({**grad, "R": 8}, "gradient_R8.json"))
    with pytest.raises(ValueError, match="the hybrid starts at the gradient's solution"):
        hybrid = {**FLEET_CFG, "cover_calibration_methods": ["hybrid"]}
        fleet_opt.blackbox_budget(hybrid, 32, "hybrid", unread)


def test_fleet_opt_calibration_cost_reads_the_files_once_and_sums_per_model_list(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import fleet_opt

    targets = []
    for i, (part, wall) in enumerate([("train", 10.0), ("heldout", 5.0), ("load", 99.0), (None, 7.0)]):
        targets.append(tmp_path / f"t{i}.json")
        targets[-1].write_text(json.dumps({"part": part, "provenance": {"wall_s": wall}}))
    fits = []
    for model, wall in [("QA_relaxed", 2.5), ("L1_mean_field", "4.0")]:
        fits.append(tmp_path / f"fit_{model}.json")
        fits[-1].write_text(json.dumps({"model": model, "wall_fit_s": wall}))
    times = fleet_opt.calibration_times(targets, fits)
    assert times["targets_s"] == 15.0 and set(times["fits"]) == {"QA_relaxed", "L1_mean_field"}
    for path in targets + fits:
        path.unlink()  # read once: the sums below need no file
    assert fleet_opt.calibration_cost(times, ["QA_relaxed", "L1_mean_field"]) == {
        "targets_s": 15.0, "fit_s": 6.5, "total_s": 21.5, "models": ["QA_relaxed", "L1_mean_field"]}
    assert fleet_opt.calibration_cost(times, ["QA_relaxed", "QA_mean_field"]) == {
        "targets_s": 15.0, "fit_s": None, "total_s": None, "models": ["QA_relaxed", "QA_mean_field"]}


def test_fleet_opt_proxy_candidate_adds_its_fit_and_reads_back_its_exact_solution(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import fleet_opt
    import torch
    from _fleet_budget import proxy_is_candidate

    from isaac_net import optimise as opt

    assert not proxy_is_candidate({}) and not proxy_is_candidate({"proxy": None})
    assert not proxy_is_candidate({"proxy": {"robots": 8}})
    assert proxy_is_candidate({"proxy": {"robots": 8, "candidate": True}})
    cost = {"targets_s": 15.0, "fit_s": 6.5, "total_s": 21.5, "models": ["QA_relaxed"]}
    assert fleet_opt.with_proxy_fit(cost, None) is cost
    assert fleet_opt.with_proxy_fit(cost, {"fit_s": 3.25, "total_s": 3.25, "rollouts": 640}) == {
        "targets_s": 15.0, "fit_s": 9.75, "total_s": 24.75, "models": ["QA_relaxed", "proxy"],
        "proxy_fit_s": 3.25, "proxy_rollouts": 640}
    missing = {**cost, "fit_s": None, "total_s": None}  # a candidate's fit not recorded: still unknown
    assert fleet_opt.with_proxy_fit(missing, {"fit_s": 3.25})["total_s"] is None
    # The proxy job's solution, read back by the gradient job bit for bit (float32 through JSON).
    fleet = opt.make_fleet(E=3, R=4, T=8, seed=1)
    dec = opt.FleetDecisions(fleet)
    g = torch.Generator().manual_seed(3)
    p = 0.02 + 0.9 * torch.rand(3, 4, generator=g)
    tx = 23.0 * torch.rand(3, 4, generator=g)
    trace = _fleet_trace((0.0, 0, [5.0, 6.0, 7.0]), (0.4, 0, [4.0, 5.5, 6.5]))
    job = {"R": 4, "model": "proxy", "result": _fleet_result("gradient, neural proxy", trace, lr=0.1),
           "calibration_cost": {"fit_s": 2.0, "total_s": 2.0, "kind": "proxy"},
           "decisions": {"p": p.tolist(), "tx_dbm": tx.tolist()}}
    path = tmp_path / "model_proxy_R4.json"
    path.write_text(json.dumps(job))
    res, cal = fleet_opt._proxy_run({"proxy": str(path)}, dec, 4)
    assert torch.equal(res.decisions["p"], p) and torch.equal(res.decisions["tx_dbm"], tx)
    assert res.decisions["B"] is fleet.B and res.decisions["pos"] is fleet.pos
    assert res.name == "gradient, neural proxy" and res.wall_s == 0.4
    assert res.heldout_cost.tolist() == [4.0, 5.5, 6.5]
    assert fleet_opt.dump(res) == job["result"] and cal == job["calibration_cost"]
    with pytest.raises(ValueError, match="proxy: expected the proxy job of R = 8"):
        fleet_opt._proxy_run({"proxy": str(path)}, dec, 8)
    path.write_text(json.dumps({k: v for k, v in job.items() if k != "decisions"}))
    with pytest.raises(ValueError, match="with its decisions"):
        fleet_opt._proxy_run({"proxy": str(path)}, dec, 4)


def test_fleet_opt_section_says_who_wins_and_where_the_gradient_loses(tmp_path):
    page = build_page(tmp_path, fixture_artifacts())
    fo = section(page, "## Gradients against black-box optimisers on L2-legacy")
    assert ("- Telemetry robots, a share 0.5 of each cell (4, 16 robots at the sizes run), messages 1-2 kB, "
            "20-200 m") in fo
    assert "- At 10 t (20 s) the lowest held-out cost is CMA-ES's (2.05)." in fo
    assert "- At 10 t (20 s) the lowest held-out cost is hybrid (gradient + CMA-ES)'s (2.85)." in fo
    assert ("- At 10 t, gradient (chosen model) is **worse than** CMA-ES: difference 1 [0.925, 1.05], "
            "better in 0 of the cells. Here the gradient side loses.") in fo
    assert ("against CMA-ES given the same 22 s: not measured (CMA-ES ran 20 s).") in fo
    assert ("against CMA-ES given the same 22 s: better than it, difference -2 [-2.07, -1.95], better in 1 "
            "of the cells.") in fo
    assert ("stays under 8 s (the calibration's 20 s spread over 3 such optimisations or more).") in fo
    assert "it pays off within this one optimisation" in fo
    assert "R = 32: met. Charged in full" in fo and "All met." in fo
    assert "| uniform policy (p = 0.3, 17 dBm) | 6.15 | 6.15 | 6.15 |" in fo
    assert "clearly worse (the interval above zero)" in fo
    assert "The gradient's wall time t = 2 s (the chosen QAD relaxed, calibrated)." in fo
    assert ("- L1D relaxed, calibrated: t_m = 5 s, held-out cost 3.55, its calibration 30 s. CMA-ES: at 3 "
            "t_m, 2.05; the model is **worse than** it (difference 1.5 [1.42, 1.55], better in 0 of the "
            "cells).") in fo
    assert "- QAD mean-field, calibrated (a candidate): t_m = 1 s" in fo
    assert "the one of QAD relaxed, QAD mean-field whose solution costs least" in fo
    assert "(L1D relaxed through the compiled step, its compile within the wall time; the others eager)" in fo
    assert ("- neural proxy: t_m = 0.5 s, held-out cost 2.55, its fit (the rollouts on L2-legacy and the "
            "training) 3 s.") in fo
    assert "With the fit charged, against CMA-ES given the same 3.5 s: better than it (difference -2.5" in fo


def test_the_run_section_spans_the_stages_and_judges_the_target(tmp_path):
    """'This run': first start to last end from the provenance, the stages' core-minutes, and the
    verdict against the cost stage's run_target_s: met, not met for want of cores, not one run."""
    arts = copy.deepcopy(fixture_artifacts())
    assert "Not measured" in section(build_page(tmp_path / "none", arts), "## This run")
    for i, name in enumerate(sorted(arts)):  # stage i starts at 60 i s and runs 12.5 s, one thread
        arts[name]["provenance"] |= {"started_unix": 1.7e9 + 60.0 * i, "cpu_count": 2}
    last = 60.0 * (len(arts) - 1) + 12.5
    arts["cost"]["provenance"]["config"]["run_target_s"] = last + 60.0
    run = section(build_page(tmp_path / "met", arts), "## This run")
    assert f"in {last / 60:.3g} min, on a machine of 2 cores" in run
    assert f"add up to {12.5 * len(arts) / 60:.3g} core-minutes" in run
    assert "come from one commit, `0123456789ab`" in run
    assert "profile is at most" in run and "min: met." in run
    # the stages ran 60 s apart with 12.5 s of work each: no start-up per job replays that span
    assert "no start-up per job up to a minute makes it the measured span" in run
    arts["cost"]["provenance"]["config"]["run_target_s"] = last - 1.0  # the work fits 2 cores, the span not
    assert "**not met**: the work fits 2 cores in that time, the schedule did not" in section(
        build_page(tmp_path / "idle", arts), "## This run")
    arts["cost"]["provenance"]["config"]["run_target_s"] = 1.0  # less than the work over 2 cores
    assert "**not met**: the work alone is more than 2 cores" in section(
        build_page(tmp_path / "short", arts), "## This run")
    # The box's yardstick: stated where measured; the span scaled by a reference box's over this run's.
    arts["cost"]["provenance"]["config"]["run_target_s"] = last + 60.0
    arts["cost"]["summary"]["yardstick_s"] = 0.9
    run = section(build_page(tmp_path / "box0", arts), "## This run")
    assert "took 0.9 s in this run, with nothing beside it. No reference box is recorded" in run
    arts["cost"]["provenance"]["config"]["box_reference"] = {"yardstick_s": 1.8, "commit": "93356fe"}
    run = section(build_page(tmp_path / "box", arts), "## This run")
    assert "On the box of the page at `93356fe` it took 1.8 s (`cost.box_reference`)" in run
    assert f"about {2 * last / 60:.3g} min there, **over the target**." in run
    arts["cost"]["provenance"]["config"]["box_reference"]["yardstick_s"] = 0.9
    assert "min there, within the target." in section(build_page(tmp_path / "box2", arts), "## This run")
    arts["cost"]["provenance"]["git_commit"] = "f" * 40
    run = section(build_page(tmp_path / "two", arts), "## This run")
    assert "more than one commit" in run and "**not met** (not one run)" in run


def test_absent_artifacts_render_as_pending_with_their_command(tmp_path):
    arts = fixture_artifacts()
    del arts["cost"], arts["sensitivity"], arts["opt_rates"], arts["calibration"]
    page = build_page(tmp_path, arts)
    for heading, name in (("## Cost", "cost"), ("## Sensitivity against L2-legacy", "sensitivity"),
                          ("## Calibration to L2-legacy", "calibration"),
                          ("## Optimization demo", "opt_rates"), ("## Placement", "placement"),
                          ("## Neural proxy", "nn_proxy")):
        text = section(page, heading)
        assert "Pending: no artifact" in text
        assert f"`snakemake --cores 32 {tmp_path / 'results' / name}.json`" in text
    assert "the K UL slots" in section(page, "## Limits")


def test_missing_value_fails_the_render():
    arts = fixture_artifacts()
    del arts["convergence"]["summary"]["L1_discrete_delay"]
    paths = {name: f"{name}.json" for name in render.STAGES}
    with pytest.raises(jinja2.UndefinedError, match="L1_discrete_delay"):
        render.render_traced(arts, paths, paths, "fixture")


@pytest.mark.parametrize("name, mutate, where", [
    ("equivalence", lambda d: d["summary"].pop("tol"), "summary"),
    ("convergence", lambda d: d.update(table="not a list"), "table"),
    ("gradcheck", lambda d: d["provenance"].pop("git_commit"), "provenance"),
    ("sensitivity", lambda d: d["summary"].update(bad=[1, 2]), "summary/bad"),
])
def test_artifact_with_a_wrong_schema_fails_clearly(tmp_path, name, mutate, where):
    arts = copy.deepcopy(fixture_artifacts())
    mutate(arts[name])
    with pytest.raises(render.ArtifactError) as err:
        build_page(tmp_path, arts)
    msg = str(err.value)
    assert f"{name}.json: artifact {name!r} does not match the schema" in msg
    assert f"at {where}" in msg


def _render_snippet(tmp_path: Path, text: str, arts: dict | None = None) -> tuple[str, dict]:
    """A one-line template rendered over the fixture artifacts, and its trace document."""
    arts = arts or fixture_artifacts()
    paths = write_artifacts(tmp_path / "results", arts)
    (tmp_path / "snippet.md.j2").write_text(text)
    page, entries = render.render_traced(arts, paths, paths, "fixture", template=tmp_path / "snippet.md.j2")
    return page, render.trace_document(page, entries, "fixture")


def test_check_numbers_flags_a_number_without_a_trace(tmp_path):
    snippet = ("E = {{ a.equivalence.provenance.config.E|num }} robots over 12 steps, `make -j 4` and "
               "{{ a.convergence.summary.L1_discrete_delay|fix }}.\n")
    page, trace = _render_snippet(tmp_path, snippet)
    assert page.startswith("E = 8 robots over 12 steps, `make -j 4` and 0.382.")
    problems = check_numbers.check_page(page, trace)
    assert len(problems) == 1 and "12 was not printed from an artifact key" in problems[0]
    # A number changed after rendering is caught too (and the page no longer matches its hash).
    problems = check_numbers.check_page(page.replace("0.382", "0.391"), trace)
    assert any("differs from the page the trace was written for" in p for p in problems)
    assert any("does not hold '0.382'" in p for p in problems)


def test_check_numbers_cli_reads_the_trace_next_to_the_page(tmp_path, capsys):
    build_page(tmp_path, fixture_artifacts())
    page = tmp_path / "page" / "page.md"
    assert check_numbers.main([str(page)]) == 0
    page.write_text(page.read_text().replace("## Cost\n", "## Cost\n\nDiscrete mean delay 0.638.\n"))
    assert check_numbers.main([str(page)]) == 1
    assert "0.638 was not printed from an artifact key" in capsys.readouterr().out


def test_trace_entries_are_checked_against_their_artifact(tmp_path):
    page, trace = _render_snippet(tmp_path, "{{ a.convergence.summary.L1_discrete_delay|fix }}\n")
    entry = trace["numbers"][0]
    assert entry["key"] == "convergence.summary.L1_discrete_delay" and entry["text"] == "0.382"
    entry["value"] = 0.5
    assert any("the artifact holds 0.382" in p for p in check_numbers.check_page(page, trace))


@pytest.mark.parametrize("text, match", [
    ("{{ a.equivalence.summary.tau }}", r"equivalence\.json: equivalence\.summary\.tau = 0\.0 printed"),
    ("{{ a.cost.table[0].forward_s * 2 }}", r"cost\.table\[0\]\.forward_s \* 2\) = 0\.8 printed without"),
    ("{{ 3 }}", "the number 3 reached the page without an artifact key"),
    ("{{ 3|num }}", "does not come from an artifact"),
    ("{{ a.cost.summary.dtype|num }}", r"cost\.json: cost\.summary\.dtype is the string 'float32', not a"),
    ("{{ a.equivalence.summary.all_pass|num }}",
     r"equivalence\.json: equivalence\.summary\.all_pass is the boolean True, not a number \(num\)"),
    ("{{ a.fd_check.summary.tol|fix }}{{ a.cost.table[0].variant|pct }}",
     r"cost\.json: cost\.table\[0\]\.variant is the string 'eager', not a number \(pct\)"),
    ("{{ a.gradcheck.summary.max_abs_gap|num }}", r"gradcheck\.json: gradcheck\.summary\.max_abs_gap is nul"),
    ("{{ a.gradcheck.summary.max_abs_gap }}", r"gradcheck\.summary\.max_abs_gap is null, printed without"),
    ("{{ a.cost.summary }}", "a whole object printed"),
])
def test_an_untraced_or_missing_number_fails_the_render(tmp_path, text, match):
    with pytest.raises(render.TraceError, match=match):
        _render_snippet(tmp_path, text)


def test_artifact_booleans_keep_their_truth_in_tests_and_cells(tmp_path):
    """An artifact's booleans carry their key (TBool) and still act as booleans in the template."""
    text = ("{{ a.equivalence.summary.all_pass|cell }} {{ 'T' if a.equivalence.summary.all_pass is true }}"
            "{{ 'F' if a.equivalence.summary.all_pass is false else '-' }}"
            "{{ a.equivalence.table|selectattr('binds')|list|length > 0 }} "
            "{{ a.equivalence.summary.all_pass }}\n")
    page, _ = _render_snippet(tmp_path, text)
    assert page == "yes T-True True\n"


def test_null_renders_in_words_when_the_template_tests_for_it(tmp_path):
    page, _ = _render_snippet(tmp_path, "{% if a.gradcheck.summary.max_abs_gap is none %}no gap{% endif %}")
    assert page == "no gap"


def test_nan_in_an_artifact_fails_the_render_with_file_and_key(tmp_path):
    arts = fixture_artifacts()
    arts["convergence"]["summary"]["L1_discrete_delay"] = float("nan")
    with pytest.raises(render.TraceError, match=r"results/convergence\.json: convergence\.summary\."
                                                r"L1_discrete_delay is nan, not a finite number"):
        build_page(tmp_path, arts)


def test_an_artifact_of_another_profile_fails_the_render(tmp_path):
    arts = fixture_artifacts()
    arts["cost"]["provenance"]["profile"] = "full"
    with pytest.raises(render.ArtifactError, match=r"cost\.json: artifact 'cost' is of profile 'full', "
                                                   r"the page is of profile 'fixture'"):
        build_page(tmp_path, arts)


@pytest.mark.parametrize("token, value, ok", [
    ("0.382", 0.38249, True), ("0.382", 0.3826, False), ("1e-4", 1.4e-4, True), ("3.9e-6", 3.96e-6, False),
    ("16", 16, True), ("-0.79", -0.7911, True),
])
def test_number_matching_respects_printed_precision(token, value, ok):
    assert check_numbers.matches(token, [value]) is ok


def profile_config(profile: str) -> dict:
    """The config Snakemake runs for ``profile``: the profile file merged over config/config.yaml."""
    from snakemake.utils import update_config

    cfg = yaml.safe_load((REPO / PROFILES["full"]).read_text())
    if profile != "full":
        update_config(cfg, yaml.safe_load((REPO / PROFILES[profile]).read_text()))
    return cfg


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_each_profile_merged_over_the_default_is_valid(profile):
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    cfg = profile_config(profile)
    jsonschema.Draft202012Validator(schema).validate(cfg)
    assert cfg["profile"] == profile


@pytest.mark.parametrize("profile", ["ci", "smoke"])
def test_reduced_profiles_are_deltas(profile):
    """A reduced profile holds only what differs from the default: each value it sets differs."""
    full = yaml.safe_load((REPO / PROFILES["full"]).read_text())
    delta = yaml.safe_load((REPO / PROFILES[profile]).read_text())

    def same(base, over, path=""):
        for k, v in over.items():
            if isinstance(v, dict) and isinstance(base.get(k), dict):
                yield from same(base[k], v, f"{path}{k}.")
            elif base.get(k) == v:
                yield f"{path}{k}"

    assert list(same(full, delta)) == []


# ------------------------------------------------------------------------------ snakemake
STUB = '''import json
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/diff")
from _hashes import record, seal
for path in snakemake.output:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if path.endswith(".json"):
        fixture = Path("fixtures") / Path(path).name
        data = json.loads(fixture.read_text()) if fixture.exists() else json.loads(
            (Path("fixtures") / "_generic.json").read_text())
        data["provenance"]["profile"] = snakemake.params.profile
        rec = data["provenance"]["inputs"] = record(list(snakemake.input), dict(snakemake.params.items()),
                                                    __file__)
        seal(data, rec)
        Path(path).write_text(json.dumps(data))
    else:
        Path(path).write_bytes(b"stub")
# The stage's settings as the stage got them (12 and 12.0 differ in JSON).
Path(snakemake.log[0]).write_text(json.dumps(snakemake.params.stage) + "\\n")
'''


def workflow_copy(dest: Path, *, stubs: bool) -> Path:
    """A copy of the workflow in ``dest``; with ``stubs`` the stage scripts copy fixtures (and record
    the hashes of what they read, with the real ``_hashes.py``)."""
    for rel in ("Snakefile", "environment.yml", "workflow/stages.yaml", "workflow/rules", "workflow/schemas",
                "workflow/report", "workflow/scripts", "config", "reports", "isaac_net",
                "benchmarks/perf/results"):
        src = REPO / rel
        if not src.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.md", "figures"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / rel)
    (dest / "benchmarks/diff").mkdir(parents=True)
    for f in (REPO / "benchmarks/diff").glob("*.py"):
        stub = stubs and f.name not in ("_hashes.py", "_fleet_budget.py")  # (the rules read these)
        (dest / "benchmarks/diff" / f.name).write_text(STUB if stub else f.read_text())
    if stubs:
        arts = fixture_artifacts() | {name: study_artifact(name) for name in STUDIES} | {
            "calibration": calibration_artifact()}
        (dest / "fixtures").mkdir()
        for name, data in arts.items():
            (dest / "fixtures" / f"{name}.json").write_text(json.dumps(data))
        (dest / "fixtures" / "_generic.json").write_text(json.dumps(study_artifact("generic")))
    return dest


def stubbed_ci_run(tmp_path: Path) -> tuple[Path, list[str], Path]:
    """A workflow copy with stub stages, run once to the report on the ci profile: the copy, the
    profile's arguments and its results folder."""
    wf = workflow_copy(tmp_path, stubs=True)
    ci = ["--configfile", "config/ci.yaml"]
    snakemake(wf, "report", "--cores", "2", *ci)
    return wf, ci, wf / "benchmarks/diff/results/ci"


def snakemake(cwd: Path, *args: str) -> str:
    proc = subprocess.run([str(SNAKEMAKE), *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def job_counts(out: str) -> dict[str, int]:
    """The first "Job stats" table of a snakemake run or dry run."""
    block = out.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    rows = [ln.split() for ln in block.splitlines()[3:]]
    return {r[0]: int(r[1]) for r in rows if len(r) == 2 and r[0] != "total"}


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_dry_run_lists_every_stage_and_the_report(tmp_path, profile):
    wf = workflow_copy(tmp_path, stubs=True)
    args = ["-n", "--forceall", "--cores", "2"]
    if profile != "full":
        args += ["--configfile", PROFILES[profile]]
    out = snakemake(wf, *args)
    jobs = job_counts(out)
    assert STAGE_JOBS | {"page", "all"} <= set(jobs)  # the default target, all, is report's twin
    assert all(jobs[name] == 1 for name in STAGE_JOBS | {"page", "all"})
    page = "reports/checks_and_measurements.md" if profile == "full" else \
        f"benchmarks/diff/results/{profile}/checks_and_measurements.md"
    assert page in out
    assert f"benchmarks/diff/results/{profile}/equivalence.json" in out


@pytest.mark.slow
def test_lint_is_clean(tmp_path):
    wf = workflow_copy(tmp_path, stubs=False)
    for args in ([], ["--configfile", "config/ci.yaml"]):
        assert "Congratulations" in snakemake(wf, "--lint", *args)


def test_python_sources_pass_ruff():
    """``make lint``'s Python half: the library, the tests, the stage scripts and the renderer."""
    ruff = Path(sys.executable).with_name("ruff")  # a dev dependency, installed beside pytest
    proc = subprocess.run([str(ruff), "check", "isaac_net", "tests", "benchmarks", "reports",
                           "workflow/scripts"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_changed_setting_reruns_only_its_stage_and_the_report(tmp_path):
    wf = workflow_copy(tmp_path, stubs=True)
    ci = ["--configfile", "config/ci.yaml"]
    out = snakemake(wf, "report", "--cores", "2", *ci)
    assert STAGE_JOBS | {"page", "report"} <= set(job_counts(out))
    page = wf / "benchmarks/diff/results/ci/checks_and_measurements.md"
    assert "Discrete mean delay: 0.382" in page.read_text()
    assert "Nothing to be done" in snakemake(wf, "-n", "report", "--cores", "2", *ci)

    cfg_path = wf / "config/ci.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["gradcheck"]["fd"]["tol"] = 2e-4  # a setting of the fd_check rule only
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = snakemake(wf, "-n", "report", "--cores", "2", *ci)
    assert set(job_counts(out)) == {"fd_check", "page", "report"}
    assert "Params have changed since last execution" in out

    cfg.setdefault("equivalence", {}).setdefault("cases", {}).setdefault("overload", {})["p"] = 0.95
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = snakemake(wf, "-n", "report", "--cores", "2", *ci)
    assert set(job_counts(out)) == {"equivalence", "fd_check", "page", "report"}


@pytest.mark.slow
def test_faults_a_deleted_artifact_is_rebuilt_and_touch_marks_a_fresh_clone_current(tmp_path):
    wf, ci, results = stubbed_ci_run(tmp_path)
    (results / "sensitivity.json").unlink()  # as Snakemake does when a stage is killed
    assert set(job_counts(snakemake(wf, "-n", "report", "--cores", "2", *ci))) == {"sensitivity", "page",
                                                                                  "report"}
    snakemake(wf, "report", "--cores", "2", *ci)
    # A fresh clone: no metadata, no logs or benchmark files, file times in checkout order.
    shutil.rmtree(wf / ".snakemake")
    shutil.rmtree(results / "bench")
    shutil.rmtree(results / "logs")
    time.sleep(1)
    for f in (wf / "isaac_net").rglob("*.py"):
        f.touch()
    assert "Nothing to be done" not in snakemake(wf, "-n", "report", "--cores", "1", *ci)
    snakemake(wf, "--cores", "1", "--touch", "report", *ci)
    assert "Nothing to be done" in snakemake(wf, "-n", "report", "--cores", "1", *ci)


@pytest.mark.slow
def test_faults_a_deleted_figure_or_page_copy_is_rebuilt(tmp_path):
    """Every file a stage declares is an input of `report`, and so is each figure's copy next to the
    page: deleting one replans the rule that writes it (Snakemake looks only for outputs that
    something asks for)."""
    wf, ci, results = stubbed_ci_run(tmp_path)
    copies = sorted(p.name for p in (results / "figures").iterdir())
    assert copies == sorted(["calibration.png", "convergence_curves.png", "fd_check.png", "fleet_opt.png",
                             "gpu.png", "nn_proxy.png", "opt_rates.png", "placement.png", "sensitivity.png"])
    assert "Nothing to be done" in snakemake(wf, "-n", "report", "--cores", "2", *ci)

    (results / "fd_check.png").unlink()  # a stage's figure: its stage reruns, then the page
    assert set(job_counts(snakemake(wf, "-n", "report", "--cores", "2", *ci))) == {"fd_check", "page",
                                                                                  "report"}
    (results / "figures" / "calibration.png").unlink()  # the page's copy: the page alone
    assert set(job_counts(snakemake(wf, "-n", "report", "--cores", "2", *ci))) == {"fd_check", "page",
                                                                                  "report"}
    snakemake(wf, "report", "--cores", "2", *ci)
    assert (results / "fd_check.png").exists() and (results / "figures" / "calibration.png").exists()
    assert "Nothing to be done" in snakemake(wf, "-n", "report", "--cores", "2", *ci)
    (results / "figures" / "calibration.png").unlink()
    assert set(job_counts(snakemake(wf, "-n", "report", "--cores", "2", *ci))) == {"page", "report"}
    (results / "nn_proxy.pt").unlink()  # a stage's other output (the proxy's model)
    assert {"nn_proxy", "page", "report"} <= set(job_counts(snakemake(wf, "-n", "report", "--cores", "2",
                                                                      *ci)))


@pytest.mark.slow
def test_faults_the_page_rules_error_reaches_its_log_and_the_terminal(tmp_path):
    wf, ci, results = stubbed_ci_run(tmp_path)
    artifact = results / "equivalence.json"
    artifact.write_text(artifact.read_text()[:100])  # truncated, and newer than the page
    proc = subprocess.run([str(SNAKEMAKE), "report", "--cores", "1", *ci], cwd=wf, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    reason = "benchmarks/diff/results/ci/equivalence.json: cannot read artifact 'equivalence'"
    log = (results / "logs" / "page.log").read_text()
    assert reason in log and "ArtifactError" in log
    assert reason in out and "lost sys.stderr" not in out
    assert str(Path("benchmarks/diff/results/ci/logs/page.log")) in out  # where Snakemake points


@pytest.mark.slow
def test_a_numeric_config_override_of_the_documented_form_is_accepted(tmp_path):
    wf = workflow_copy(tmp_path, stubs=True)
    out = snakemake(wf, "-n", "--forceall", "report", "--cores", "2", "--configfile", "config/ci.yaml",
                    "--config", "convergence={default_tau: 0.2, table: {T: 12}}")
    assert "convergence_table" in job_counts(out)


@pytest.mark.slow
def test_numeric_overrides_reach_the_stage_as_typed(tmp_path):
    """Digits alone are an integer, a point or an exponent a float: the stage gets 12 and 1e-4."""
    wf = workflow_copy(tmp_path, stubs=True)
    snakemake(wf, "benchmarks/diff/results/ci/equivalence.json", "--cores", "1", "--configfile",
              "config/ci.yaml", "--config", "equivalence={T: 12, tol: 1e-4, cases: {normal: {p: .5}}}")
    stage = json.loads((wf / "benchmarks/diff/results/ci/logs/equivalence.log").read_text())
    assert stage["T"] == 12 and isinstance(stage["T"], int)
    assert stage["tol"] == 1e-4 and isinstance(stage["tol"], float)
    assert stage["cases"]["normal"]["p"] == 0.5


def _override_error(wf: Path, *config: str) -> str:
    proc = subprocess.run([str(SNAKEMAKE), "-n", "report", "--cores", "1", "--configfile", "config/ci.yaml",
                           "--config", *config], cwd=wf, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Job stats" not in proc.stdout
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("override, message", [
    # YAML 1.1 would read 012 as the octal 10
    ("equivalence={T: 012}", "equivalence/T = '012': a number with a leading zero"),
    # integral, but a float: integer keys take integers as typed
    ("equivalence={T: 1.5e3}", "equivalence/T = 1500.0 is a float (a point or an exponent makes one), and "
                               "this key takes an integer: write 1500"),
    ("equivalence={E: 4.0}", "equivalence/E = 4.0 is a float"),
    ("calibrate={R: 4.0}", "calibrate/R = 4.0 is a float"),  # an integer or a list of them (oneOf)
    ("threads=4.0", "threads = 4.0 is a float"),  # a top-level value, parsed by Snakemake
    ("convergence={default_tau: 1e400}", "convergence/default_tau = '1e400' is not a finite number"),
    ("threads=inf", "threads = inf is not a finite number"),
    ("gradcheck={tau: nan}", "gradcheck/tau: 'nan' is not of type 'number'"),
])
def test_numeric_overrides_are_refused_at_parse_time_naming_the_key(tmp_path, override, message):
    assert message in _override_error(workflow_copy(tmp_path, stubs=True), override)


def _parse_error(wf: Path, mutate) -> str:
    cfg_path = wf / "config/ci.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    mutate(cfg)
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = subprocess.run([str(SNAKEMAKE), "-n", "report", "--cores", "1", "--configfile", "config/ci.yaml"],
                          cwd=wf, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Job stats" not in proc.stdout
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["convergence"].update(default_tau=0.3), "convergence/default_tau = 0.3 is not one of "
                                                          "convergence/table/taus"),
    (lambda c: c["sensitivity"].update(warmup=c["sensitivity"]["T"]), "sensitivity/warmup = "),
    (lambda c: c["gradcheck"]["small"].setdefault("cell", {}).update(qa_sr_slots=9),
     "gradcheck/small/cell/qa_sr_slots = 9 exceeds gradcheck/small/cell/num_slots = 4"),
    # a config file's numbers: the schema's number is finite, its integer an integer as typed
    (lambda c: c["cost"].update(speedup_bar=float("inf")), "cost/speedup_bar = inf is not a finite number"),
    (lambda c: c["equivalence"].update(E=4.0), "equivalence/E = 4.0 is a float"),
])
def test_cross_field_config_errors_fail_at_parse_time(tmp_path, mutate, message):
    assert message in _parse_error(workflow_copy(tmp_path, stubs=True), mutate)


def test_cost_stage_adds_the_cuda_graph_rows_on_a_gpu_only():
    """The cost stage's jobs: the captured discrete step (L1, QA, L2-legacy) is measured on CUDA only."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost

    params = yaml.safe_load((REPO / PROFILES["full"]).read_text())["cost"]
    cpu, gpu = cost._jobs(params, "cpu"), cost._jobs(params, "cuda")
    assert not any(j.get("backend") == "cuda_graph" for j in cpu)
    graphed = [j for j in gpu if j.get("backend") == "cuda_graph"]
    assert sorted((j["name"], j["E"]) for j in graphed) == sorted(
        (lv, E) for lv in ("L1", "QA", "L2-legacy") for E in params["E"])
    assert {cost._variant(j) for j in graphed} == {"discrete, cuda graph"}
    assert {cost._variant(j) for j in cpu} == {
        "eager", "compiled", "per-slot autograd", "per-op autograd", "discrete",
        "discrete, eager slot loop", "discrete, numba slot loop", "compiled, first call, fresh machine",
        "compiled, first call, cold cache", "compiled, first call, warm cache",
        "discrete, numba first call, cold cache",
        "discrete, numba first call, warm cache"}
    # L2-legacy's slot loops side by side, one thread, at each of their E; never on CUDA
    l2 = params["l2_backends"]
    slot = [j for j in cpu if j.get("backend") in ("eager", "numba") and not j.get("cache")]
    assert sorted((j["name"], j["E"], j["threads"], j["backend"]) for j in slot) == sorted(
        ("L2-legacy", E, 1, b) for E in l2["E"] for b in ("eager", "numba"))
    assert not any(j.get("backend") in ("eager", "numba") for j in gpu)
    # its numba kernel's first calls come first, cold before warm (the stage's numba cache is empty)
    assert [(j.get("backend"), j.get("cache")) for j in cpu[:2]] == [("numba", "cold"), ("numba", "warm")]
    cpu = cpu[2:]
    assert {j["name"] for j in cpu if cost._variant(j) == "compiled"} == {"L1", "QA"}
    extra = [E for E in params["speedup_E"] if E not in params["E"]]
    assert sorted((j["E"], j["compile"]) for j in cpu if j["name"] == "QA" and j["E"] in extra) == sorted(
        (E, c) for E in extra for c in (False, True))
    assert sorted((j["name"], j["E"]) for j in cpu if j.get("slots") == "autograd") == sorted(
        [(m, E) for m in ("L1", "QA") for E in params["E"]] + [("L1", E) for E in extra])
    # the first compiled calls run first, fresh, then cold before warm, while each model's cache is empty
    first = [(j["name"], j["cache"]) for j in cpu if j.get("cache")]
    assert first == [(m, c) for m in params["modes"] for c in ("fresh", "cold", "warm")]
    assert [j.get("cache") for j in cpu[:len(first)]] == [c for _, c in first]


def test_l2_bar_scales_the_anchor_commits_rollout_by_the_yardsticks_and_says_met_per_e(tmp_path):
    """The fast L2-legacy issue's bar: an earlier commit's default rollout (config anchor), scaled by
    this run's yardstick over the anchor's, over this run's numba rollout, against the targets."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost

    def row(backend, E, s):
        return {"model": "L2-legacy", "variant": f"discrete, {backend} slot loop", "available": True, "E": E,
                "forward_s": s}

    rows = [row("eager", 16, 1.6), row("numba", 16, 0.08), row("eager", 64, 2.0), row("numba", 64, 0.2),
            row("eager", 256, 5.0), row("numba", 256, 1.0)]
    params = {"l2_legacy": True, "l2_backends": {
        "E": [16, 64, 256], "first_call_E": 16, "cold_s": 60, "warm_s": 5,
        "speedup_targets": [[16, 10], [64, 10]],
        "anchor": {"commit": "abc1234", "rollout_s": {"16": 2.0, "64": 3.0},
                   "yardstick_s": {"16": 0.5, "64": 0.5}}}}
    side, _ = cost._l2_rows(rows, params, 60, yard_s=0.25)  # a box twice as fast: the anchor's times halve
    by_E = {r["E"]: r for r in side}
    assert by_E[16]["anchor_s"] == pytest.approx(1.0) and by_E[16]["anchor_speedup"] == pytest.approx(12.5)
    assert by_E[16]["anchor_met"] is True and by_E[16]["speedup"] == pytest.approx(20.0)
    assert by_E[64]["anchor_speedup"] == pytest.approx(7.5) and by_E[64]["anchor_met"] is False
    assert "anchor_speedup" not in by_E[256]  # the anchor has no time there
    assert cost._l2_rows(rows, params, 60, yard_s=None)[0][0]["anchor_speedup"] is None  # no yardstick
    del params["l2_backends"]["anchor"]
    assert "anchor_speedup" not in cost._l2_rows(rows, params, 60, yard_s=0.25)[0][0]

    arts = fixture_artifacts()
    arts["cost"]["l2_backends"], arts["cost"]["l2_first_calls"] = side, None
    arts["cost"]["summary"]["yardstick_s"] = 0.25
    arts["cost"]["provenance"]["config"]["l2_backends"] = {
        **params["l2_backends"],
        "anchor": {"commit": "abc1234", "rollout_s": {"16": 2.0, "64": 3.0},
                   "yardstick_s": {"16": 0.5, "64": 0.5}}}
    text = section(build_page(tmp_path, arts), "## Cost")
    assert ("compares the default step with the default of commit `abc1234` (the eager slot loop then; "
            "`benchmarks/perf/l2_anchor.py` timed it on another day, and its times here are "
            "scaled by this run's yardstick, 0.25 s, over the one timed beside each of them, 0.5 and 0.5 s): "
            "at E = 16 "
            "12.5× faster (1 s a rollout against 0.08 s; bar 10×, met); at E = 64 7.5× faster (1.5 s a "
            "rollout against 0.2 s; bar 10×, **not met**).") in text


def test_cost_parts_split_the_rows_by_the_cores_they_need_and_merge_in_the_stage_order(monkeypatch, tmp_path):
    """The threads part measures the table's rows at its E (1 and 2 threads, their autograd baselines),
    the compiled first calls and L2-legacy's two slot loops (with nothing beside them); the serial part the
    comparisons that hold within themselves (the speed-up at more batch sizes) and the large rollout; the
    merge orders the parts' rows as one job would have."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost

    params = yaml.safe_load((REPO / PROFILES["full"]).read_text())["cost"]
    jobs = cost._jobs(params, "cpu")
    assert {j["part"] for j in jobs} == set(cost.PARTS)
    for j in jobs:
        in_table = j["E"] in params["E"] and not j.get("backend") and "T" not in j
        l2_loops = j["name"] == "L2-legacy" and bool(j.get("backend"))
        assert j["part"] == ("threads" if in_table or l2_loops else "serial"), j
    variants = {p: {cost._variant(j) for j in jobs if j["part"] == p} for p in cost.PARTS}
    assert {"compiled, first call, cold cache", "per-slot autograd", "eager", "compiled",
            "discrete"} <= variants["threads"]
    assert {j["threads"] for j in jobs if j["part"] == "serial"} == {1}
    assert {"discrete, eager slot loop", "discrete, numba slot loop",
            "discrete, numba first call, cold cache"} <= variants["threads"]
    assert not any(v.startswith("discrete") for v in variants["serial"])
    assert {j["E"] for j in jobs if j["part"] == "serial" and j["kind"] == "relaxed"} == {
        *[E for E in params["speedup_E"] if E not in params["E"]], params["large"]["E"]}

    class Stage:
        device = "cpu"

        def write_json(self, path, payload):
            written[path] = payload

    written = {}
    seen = []  # each part measures its own jobs, in the stage's order
    monkeypatch.setattr(cost, "measure_in_child", lambda spec, *a, **k: seen.append(spec["job"]) or {
        "forward_s": 1.0, "backward_s": 1.0, "first_call_s": 1.0, "import_s": 0.5, "first_forward_s": 1.0,
        "first_backward_s": 1.0, "peak_rss_mib": 300.0})
    monkeypatch.setattr(cost.torch.cuda, "is_available", lambda: False)
    yards = []  # the box's yardstick: measured once, in the part that has every core to itself
    monkeypatch.setattr(cost, "yardstick_s", lambda repeats: yards.append(repeats) or 0.7)
    for p in cost.PARTS:
        cost.main(Stage(), params, {"json": str(tmp_path / f"{p}.json")}, part=p)
    assert yards == [params["repeats"]]
    assert [written[str(tmp_path / f"{p}.json")]["yardstick_s"] for p in cost.PARTS] == [
        0.7 if p == "threads" else None for p in cost.PARTS]
    assert sorted(seen) == list(range(len(jobs))) and seen != sorted(seen)  # all once, out of order
    for p in cost.PARTS:
        (tmp_path / f"{p}.json").write_text(json.dumps(written[str(tmp_path / f"{p}.json")]))
    out = {"json": "cost.json", "parts": [str(tmp_path / f"{p}.json") for p in reversed(cost.PARTS)]}
    cost.main(Stage(), params, out, part="merge")
    table = written["cost.json"]["table"]
    assert [(r["variant"], r["E"], r["threads"]) for r in table] == [
        (cost._variant(j), j["E"], j["threads"]) for j in jobs]
    assert not any("job" in r for r in table)
    assert written["cost.json"]["summary"]["yardstick_s"] == 0.7
    with pytest.raises(ValueError, match="part: expected one of serial, threads, merge or none"):
        cost.main(Stage(), params, {}, part="gpu")


def test_the_yardstick_times_a_fixed_workload_on_one_thread_and_restores_the_threads():
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost

    threads = cost.torch.get_num_threads()
    seconds = cost.yardstick_s(1, steps=50)
    assert seconds > 0.0 and seconds != float("inf") and cost.torch.get_num_threads() == threads
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="repeats: expected a positive int"):
            cost.yardstick_s(bad)


def test_compile_pays_for_itself_after_the_rollouts_its_first_call_costs():
    """N rollouts with compile=True (first call, then steady ones) against N eager: the smallest N
    where compiling is no slower; never where the compiled rollout is not the faster."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost

    w = {"fresh_s": 55.0, "cold_s": 47.5, "warm_s": 0.9}
    got = cost._break_even(w, eager_s=0.9, compiled_s=0.12)
    # (55 - 0.12) / 0.78 = 70.4, (47.5 - 0.12) / 0.78 = 60.7; a first call as fast as eager pays at once
    assert (got["fresh_break_even"], got["cold_break_even"], got["warm_break_even"]) == (71, 61, 1)
    assert got["pays"] is True and (got["eager_steady_s"], got["compiled_steady_s"]) == (0.9, 0.12)
    n = got["cold_break_even"]
    assert 47.5 + (n - 1) * 0.12 <= n * 0.9 < 47.5 + (n - 2) * 0.12 + 0.9  # n pays, n - 1 does not
    never = cost._break_even(w, eager_s=0.03, compiled_s=0.036)
    assert never["pays"] is False and never["cold_break_even"] is None
    missing = cost._break_even({**w, "fresh_s": None}, eager_s=None, compiled_s=0.12)
    assert missing["pays"] is None and missing["warm_break_even"] is None
    assert cost._break_even({**w, "fresh_s": None}, 0.9, 0.12)["fresh_break_even"] is None


def test_first_calls_get_their_own_directories(monkeypatch):
    """The fresh machine compiles into its own empty cache and temporary directory; the cold and warm
    first calls share that temporary directory (inductor's precompiled header) and the model's cache;
    the steady rows use the model's cache and the system's temporary directory. L2-legacy's numba rows,
    first calls and steady ones, use the stage's numba cache directory."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost

    calls = []
    monkeypatch.setattr(cost, "measure_in_child",
                        lambda spec, timeout_s, cache_dir=None, tmp_dir=None, numba_dir=None: calls.append(
                            (spec.get("cache"), cache_dir, tmp_dir, numba_dir))
                        or {"forward_s": 1.0, "backward_s": 1.0, "first_call_s": 1.0})
    dirs = {"QA": {"cache": "/c", "fresh": "/f", "tmp": "/t"}, "L2-legacy": {"numba": "/n"}}
    rows = []
    for cache in ("fresh", "cold", "warm", None):
        job = {"kind": "relaxed", "name": "QA", "E": 16, "compile": True, "threads": 1, "device": "cpu",
               "job": len(rows), **({"cache": cache} if cache else {})}
        cost._measure_job(job, {"R": 8, "T": 60}, {"timeout_s": 10}, dirs, rows, {})
    for cache in ("cold", "warm", None):
        job = {"kind": "discrete", "name": "L2-legacy", "E": 16, "compile": False, "threads": 1,
               "device": "cpu", "backend": "numba", "job": len(rows), **({"cache": cache} if cache else {})}
        cost._measure_job(job, {"R": 8, "T": 60}, {"timeout_s": 10}, dirs, rows, {})
    assert calls == [("fresh", "/f", "/t", None), ("cold", "/c", "/t", None), ("warm", "/c", "/t", None),
                     (None, "/c", None, None), ("cold", None, None, "/n"), ("warm", None, None, "/n"),
                     (None, None, None, "/n")]
    assert [r["variant"] for r in rows] == [f"compiled, first call, {what}" for what in
                                            ("fresh machine", "cold cache", "warm cache")] + ["compiled"] + [
        "discrete, numba first call, cold cache", "discrete, numba first call, warm cache",
        "discrete, numba slot loop"]


def test_a_measure_child_gets_the_cache_and_temporary_directory_it_is_given(monkeypatch):
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost

    seen = []
    monkeypatch.setattr(cost, "run_child", lambda cmd, timeout_s, env=None: seen.append(env) or (0, "{}", ""))
    cost.measure_in_child({}, 10, "/c", "/t")
    cost.measure_in_child({}, 10, "/c")
    cost.measure_in_child({}, 10)
    assert seen == [{"TORCHINDUCTOR_CACHE_DIR": "/c", "TMPDIR": "/t"}, {"TORCHINDUCTOR_CACHE_DIR": "/c"},
                    None]


CHILD = """
import os, sys, time
sys.path.insert(0, {diff!r})
import cost
cost.die_with_parent(poll_s=0.05)
open({pidfile!r}, "w").write(str(os.getpid()))
time.sleep(120)
"""
PARENT = """
import sys
sys.path.insert(0, {diff!r})
import cost
cost.run_child([sys.executable, "-c", {child!r}], timeout_s=120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc: Linux")
def test_cost_child_dies_with_its_parent_group(tmp_path):
    """A kill of the cost stage's process group also ends its --measure child (own session)."""
    diff, pidfile = str(REPO / "benchmarks" / "diff"), str(tmp_path / "child.pid")
    child = CHILD.format(diff=diff, pidfile=pidfile)
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(diff=diff, child=child)],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not Path(pidfile).exists() or not Path(pidfile).read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the child did not start"
            time.sleep(0.1)
        pid = int(Path(pidfile).read_text())
        assert _alive(pid) and os.getpgid(pid) != os.getpgid(parent.pid)
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the --measure child outlived its parent"
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)


@pytest.mark.slow
def test_snakemake_html_report_has_the_page_figures_and_captions(tmp_path):
    """`snakemake --report` on the ci profile after a (stubbed) ci run."""
    wf, ci, _ = stubbed_ci_run(tmp_path)
    snakemake(wf, "--report", "report.html", *ci)
    html = (wf / "report.html").read_text()
    for name in ("equivalence", "convergence_curves", "fd_check", "cost", "nn_proxy"):
        assert (wf / "workflow/report" / f"{name}.rst").exists()
        assert f"{name}.json" in html
    assert "The JSON artifact holds the numbers and their provenance" in html
    assert "checks_and_measurements.md" in html and "config/ci.yaml" in html


# ------------------------------------------------------------------------------ restore (fresh clone)
sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
import _hashes  # noqa: E402

CI = ("--configfile", "config/ci.yaml")
RESTORE = ("workflow/scripts/restore.py", *CI)


def test_hash_record_matches_until_a_source_param_or_output_changes(tmp_path):
    """The record an artifact keeps of what it was computed from, against a synthetic checkout."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib/model.py").write_text("x = 1\n")
    (tmp_path / "stage.py").write_text("print(1)\n")
    (tmp_path / "fig.png").write_bytes(b"png")
    params = {"stage": {"tau": 0.05, "cases": {"a": [1, 2]}}, "profile": "ci", "part": "fd"}
    inputs = ["lib/model.py"]
    rec = _hashes.record(inputs, params, tmp_path / "stage.py", outputs=["fig.png"], root=tmp_path)
    assert set(rec["files"]) == {"lib/model.py", "stage.py"} and set(rec["outputs"]) == {"fig.png"}
    assert _hashes.mismatches(rec, inputs, params, "stage.py", tmp_path) == []
    # Key order of the params does not matter; a value does.
    assert _hashes.mismatches(rec, inputs, {"part": "fd", "profile": "ci", "stage": params["stage"]},
                              "stage.py", tmp_path) == []
    changed = copy.deepcopy(params)
    changed["stage"]["tau"] = 0.1
    assert _hashes.mismatches(rec, inputs, changed, "stage.py", tmp_path) == ["params changed"]
    (tmp_path / "lib/new.py").write_text("y = 2\n")
    assert _hashes.mismatches(rec, [*inputs, "lib/new.py"], params, "stage.py",
                              tmp_path) == ["lib/new.py is new"]
    (tmp_path / "lib/model.py").write_text("x = 2\n")
    assert _hashes.mismatches(rec, inputs, params, "stage.py", tmp_path) == ["lib/model.py changed"]
    (tmp_path / "lib/model.py").write_text("x = 1\n")
    (tmp_path / "fig.png").write_bytes(b"edited")
    assert "output fig.png differs" in _hashes.mismatches(rec, inputs, params, "stage.py", tmp_path)[0]
    assert _hashes.mismatches(None, inputs, params, "stage.py", tmp_path) == ["no input hashes recorded"]
    # The artifact itself: sealed as written, not after an edit.
    doc = {"summary": {"x": 1.5}, "provenance": {"inputs": rec}}
    _hashes.seal(doc, rec)
    loaded = json.loads(json.dumps(doc, indent=1))
    assert _hashes.sealed(loaded, loaded["provenance"]["inputs"])
    doc["summary"]["x"] = 1.6
    assert not _hashes.sealed(doc, rec)


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    """A (stubbed) ci run whose artifacts record their input hashes."""
    wf = workflow_copy(tmp_path_factory.mktemp("ci_run"), stubs=True)
    snakemake(wf, "report", "--cores", "2", *CI)
    return wf


def fresh_clone(run: Path, dest: Path) -> Path:
    """``run`` as a fresh clone has it: no Snakemake metadata, logs or benchmark files, and every
    file dated by the checkout (sources last, as git may write them)."""
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns(".snakemake", "logs", "bench"))
    now = time.time()
    for f in (p for p in dest.rglob("*") if p.is_file()):
        t = now - (5 if f.suffix == ".py" else 10)
        os.utime(f, (t, t))
    return dest


def restore(wf: Path) -> str:
    proc = subprocess.run([sys.executable, *RESTORE], cwd=wf, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def planned(wf: Path, *args: str) -> set[str]:
    out = snakemake(wf, "-n", "report", "--cores", "1", *CI, *args)
    return set() if "Nothing to be done" in out else set(job_counts(out))


@pytest.mark.slow
def test_restore_marks_a_fresh_clone_current_from_its_hashes(ci_run, tmp_path):
    wf = fresh_clone(ci_run, tmp_path / "clone")
    assert STAGE_JOBS <= planned(wf)  # git's file times: every stage looks out of date
    out = restore(wf)
    assert "0 left to rerun" in out, out
    assert planned(wf) == set()
    # With the metadata restore wrote, the default triggers and mtime alone agree.
    assert planned(wf, "--rerun-triggers", "mtime") == set()


@pytest.mark.slow
def test_restore_after_a_changed_param_reruns_that_stage_and_the_page(ci_run, tmp_path):
    wf = fresh_clone(ci_run, tmp_path / "clone")
    restore(wf)
    cfg_path = wf / "config/ci.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["gradcheck"]["tau"] = 0.07  # the gradcheck section's: gradcheck and fd_check read it
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    expected = {"gradcheck", "fd_check", "page", "report"}
    assert planned(wf) == expected  # Snakemake's params trigger, from the metadata restore wrote
    out = restore(wf)  # a second restore agrees, and dates them stale (mtime alone sees it too)
    assert "stale   gradcheck" in out and "params changed" in out
    assert planned(wf) == expected
    assert planned(wf, "--rerun-triggers", "mtime") == expected


@pytest.mark.slow
def test_restore_after_a_changed_library_source_reruns_every_stage(ci_run, tmp_path):
    wf = fresh_clone(ci_run, tmp_path / "clone")
    src = wf / "isaac_net/core/radio.py"
    src.write_text(src.read_text() + "\n# changed\n")
    out = restore(wf)
    assert "isaac_net/core/radio.py changed" in out
    assert STAGE_JOBS | {"page", "report"} <= planned(wf, "--rerun-triggers", "mtime")


@pytest.mark.slow
def test_restore_leaves_a_corrupted_or_unhashed_artifact_stale(ci_run, tmp_path):
    wf = fresh_clone(ci_run, tmp_path / "clone")
    results = wf / "benchmarks/diff/results/ci"
    eq = results / "equivalence.json"
    eq.write_text(eq.read_text().replace('"max_rel_delay_sum": 3.3e-16', '"max_rel_delay_sum": 3.4e-16', 1))
    cost = results / "cost.json"  # as the committed full artifacts before this record existed
    data = json.loads(cost.read_text())
    del data["provenance"]["inputs"]
    cost.write_text(json.dumps(data))
    out = restore(wf)
    assert "equivalence.json differs from the one its run wrote" in out
    assert "no input hashes recorded" in out
    assert planned(wf) == {"equivalence", "cost", "page", "report"}


# ------------------------------------------------------------------------------ catalog conventions, tables
sys.path.insert(0, str(REPO / "workflow" / "scripts"))
import config_doc  # noqa: E402


def test_config_readme_is_generated_from_the_schema():
    """config/README.md documents every key of the config schema, with the schema's descriptions."""
    text, missing = config_doc.render()
    assert missing == [], f"keys without a description in the schema: {missing}"
    assert (REPO / "config/README.md").read_text() == text, \
        "config/README.md is out of date: python workflow/scripts/config_doc.py > config/README.md"
    full = yaml.safe_load((REPO / PROFILES["full"]).read_text())

    def keys(node, path=""):
        for k, v in node.items():
            # (a dict keyed by batch sizes is one value per E, not keys of its own)
            if isinstance(v, dict) and k != "cases" and not all(str(x).isdigit() for x in v):
                yield from keys(v, f"{path}{k}.")
            else:
                yield f"{path}{k}"
    documented = set(re.findall(r"^\| `([^`]+)`", text, flags=re.M))
    assert [k for k in keys(full) if k not in documented and not k.split(".")[-2:-1] == ["cell"]] == []


def test_workflow_catalog_file_names_the_target_and_the_report():
    usage = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())["usage"]
    assert usage["mandatory-flags"]["flags"] == "report" and usage["report"] is True
    assert usage["software-stack-deployment"]["conda"] is True


def test_rules_pass_snakefmt():
    snakefmt = Path(sys.executable).with_name("snakefmt")
    if not snakefmt.exists():
        pytest.skip("snakefmt is not installed (a dev dependency)")
    proc = subprocess.run([str(snakefmt), "--check", "Snakefile", "workflow/rules/"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_artifact_has_a_tidy_table_with_unit_named_columns():
    import _tables

    arts = fixture_artifacts() | {name: study_artifact(name) for name in STUDIES} | {
        "calibration": calibration_artifact()}
    for name, data in arts.items():
        frames = _tables.tables(name, json.loads(json.dumps(data)))
        assert len(frames[""]) > 0, name
        for df in frames.values():  # one value per cell
            assert not df.map(lambda v: isinstance(v, (list, dict))).any().any(), name
    assert "mean_delay_steps" in _tables.tables("convergence", arts["convergence"])[""].columns
    curves = _tables.tables("convergence_curves", arts["convergence_curves"])[""]
    assert {"mode", "load", "tau", "relaxed_mean_delay_steps"} <= set(curves.columns)
    assert len(curves) == sum(len(c["taus"]) for c in arts["convergence_curves"]["curves"])
    fd = _tables.tables("fd_check", arts["fd_check"])[""]
    assert len(fd) == len(arts["fd_check"]["rows"]) * len(arts["fd_check"]["steps"])


def test_a_stage_writes_its_csv_beside_its_json(tmp_path):
    """Stage.write_json writes the rule's csv outputs from the artifact, and seals the JSON."""
    import _common
    import pandas as pd

    arts = {name: study_artifact(name) for name in STUDIES}
    out = {"json": str(tmp_path / "sensitivity.json"), "csv": str(tmp_path / "sensitivity.csv"),
           "csv_agreement": str(tmp_path / "sensitivity_agreement.csv")}
    stage = _common.Stage("sensitivity", {"seed": 0}, "fixture", 1)
    stage.outputs = out
    stage.job = {"inputs": [], "params": {"stage": {"seed": 0}}, "script": None}
    with stage:
        payload = {k: v for k, v in arts["sensitivity"].items() if k != "provenance"}
        stage.write_json(out["json"], payload)
    rows = pd.read_csv(out["csv"])
    agreement = pd.read_csv(out["csv_agreement"])
    assert {"op", "derivative", "model", "ratio"} <= set(rows.columns)
    assert {"model", "points", "resolved_rows", "sign_ok_frac", "median_ratio"} <= set(agreement.columns)
    data = json.loads(Path(out["json"]).read_text())
    rec = data["provenance"]["inputs"]
    assert "benchmarks/diff/_tables.py" in rec["files"]  # the modules the stage imported
    assert _hashes.sealed(data, rec)
    import numba
    import numpy as np

    # the numeric stack it ran on, beside torch and the CPU (docs/design.md, section 7)
    assert data["provenance"]["packages"]["numpy"] == np.__version__
    assert data["provenance"]["packages"]["numba"] == numba.__version__
    assert data["provenance"]["packages"]["pandas"] == pd.__version__
    assert set(data["provenance"]["packages"]) == set(_common.PACKAGES)


def test_cost_discrete_row_keeps_fewer_passes_once_they_add_up_to_repeat_time_s():
    """A discrete level's row is the best of ``repeats`` passes, or of at least two once the passes add
    up to ``repeat_time_s`` (a long pass is disturbed by a smaller share of itself)."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost
    import torch
    from _common import draw_inputs

    x = draw_inputs(2, 3, 4, [4000, 30000], 0, p=0.5, tx_dbm=23.0, dtype=torch.float32, device="cpu")
    every = cost.discrete("L1", 2, 3, 4, torch.float32, "cpu", x, 4, 0)
    assert every["passes"] == 4 and every["forward_s"] > 0
    assert cost.discrete("L1", 2, 3, 4, torch.float32, "cpu", x, 4, 0, repeat_time_s=1e-9)["passes"] == 2
    assert cost.discrete("L1", 2, 3, 4, torch.float32, "cpu", x, 4, 0, repeat_time_s=1e9)["passes"] == 4
    assert cost.discrete("L1", 2, 3, 4, torch.float32, "cpu", x, 1, 0, repeat_time_s=1e-9)["passes"] == 1


def test_stage_scripts_import_neither_scipy_stats_nor_matplotlib_until_used():
    """Every stage job and every cost measurement is a fresh interpreter that imports these modules;
    scipy.stats (1.2 s) and matplotlib (0.6 s) are imported where a bootstrap or a figure needs them,
    not at the top (some 80 jobs a full profile, most of which draw and resample nothing)."""
    diff = REPO / "benchmarks" / "diff"
    stages = sorted(p.stem for p in diff.glob("*.py"))
    code = (f"import sys; sys.path.insert(0, {str(diff)!r}); import isaac_net.optimise; "
            + "; ".join(f"import {m}" for m in stages)
            + "; print([m for m in ('scipy.stats', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(stages) >= 10 and out.stdout.strip() == "[]"
    # ... and scipy.stats is there when a bootstrap interval needs it (test_kpi and test_studies
    # draw the figures)
    sys.path.insert(0, str(diff))
    import numpy as np
    from _common import ratio_ci

    ratio, lo, hi = ratio_ci(np.array([2.0, 2.2, 1.8, 2.1]), np.array([1.0, 1.1, 0.9, 1.0]), 200,
                             np.random.default_rng(0))
    assert ratio == pytest.approx(8.1 / 4.0) and lo < ratio < hi
