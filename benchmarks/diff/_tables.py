"""Tidy tables of the stage artifacts: one row per observation, columns named with their units.

Each stage's artifact ``<name>.json`` gets ``<name>.csv`` beside it (and, for sensitivity,
``sensitivity_agreement.csv``), written by ``Stage.write_json`` when the rule declares the
output (``csv``, ``csv_<table>``). The JSON stays the page's source; the CSVs are for reading
the measurements with pandas::

    import pandas as pd
    rows = pd.read_csv("benchmarks/diff/results/full/sensitivity.csv")

``tables(name, artifact)`` builds the frames from an artifact's dict (also one already written:
``tables("cost", json.load(open(".../cost.json")))``). Units: delays and AoI in steps, energy
in J, times in s, memory in MiB, power in dBm, distances in m; ratios and probabilities bare.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

# KPI and input names -> column names with their units.
UNITS = {
    "mean_delay": "mean_delay_steps", "mean_aoi": "mean_aoi_steps", "p": "p_send",
    "discrete": "discrete_mean_delay_steps", "relaxed": "relaxed_mean_delay_steps",
    "delay_bias": "delay_bias_steps", "step": "fd_step",
}


def _cells(df: pd.DataFrame) -> pd.DataFrame:
    """Lists and dicts left in cells as JSON text (a CSV cell holds one value)."""
    for col in df.columns:
        if df[col].map(lambda v: isinstance(v, (list, dict))).any():
            df[col] = df[col].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    return df


def _frame(rows) -> pd.DataFrame:
    df = pd.json_normalize(list(rows), sep="_") if rows else pd.DataFrame()
    return _cells(df.rename(columns=UNITS))


def _convergence(a: dict) -> dict:
    """One row per temperature and mode (L1, QA): the relaxed KPIs and their errors."""
    long = []
    for row in a["table"]:
        for mode in ("L1", "QA"):
            prefix = f"{mode}_"
            long.append({"tau": row["tau"], "mode": mode,
                         **{k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix)}})
    return {"": _frame(long)}


def _convergence_curves(a: dict) -> dict:
    """One row per mode, load and temperature: the relaxed delay against the discrete one."""
    df = pd.DataFrame(a["curves"]).explode(["taus", "relaxed", "err_pct"]).rename(
        columns={"taus": "tau", "err_pct": "delay_err_pct", "slope": "err_slope_loglog"})
    return {"": _frame(df.to_dict("records"))}


def _fd_check(a: dict) -> dict:
    """One row per mode, input and finite-difference step."""
    df = pd.DataFrame(a["rows"]).assign(step=[a["steps"]] * len(a["rows"]))
    df = df.explode(["step", "fd", "rel_err"]).rename(columns={"fd": "fd_derivative",
                                                               "autograd": "autograd_derivative"})
    return {"": _frame(df.to_dict("records"))}


def _sensitivity(a: dict) -> dict:
    """One row per operating point, derivative and model; and the agreement per model and point
    group (the points the stage chose, or held out), by groupby over the rows whose
    finite-difference reference is resolved (``fd_significant``)."""
    rows = [{k: v for k, v in r.items() if k != "models"} | {"model": m} | vals
            for r in a["table"] for m, vals in r["models"].items()]
    df = _frame(rows)
    df["points"] = df["held_out"].map({True: "held_out", False: "stage"})
    resolved = df[df["fd_significant"]].assign(
        sign_ok=lambda d: d["verdict"] == "sign_ok",
        ci_covers_1=lambda d: (d["ratio_lo"] <= 1) & (d["ratio_hi"] >= 1))
    agreement = resolved.groupby(["model", "points"], sort=False).agg(
        resolved_rows=("derivative", "size"), sign_ok_frac=("sign_ok", "mean"),
        median_ratio=("ratio", "median"), ci_covers_1_frac=("ci_covers_1", "mean"),
    ).reset_index()
    return {"": df, "agreement": agreement}


def _solutions(a: dict) -> dict:
    """One row per solution: its scores and its mean decision (rates, power or positions)."""
    df = _frame(a["table"])
    means = a.get("solutions_mean") or {}
    if means:
        dec = pd.DataFrame.from_dict(means, orient="index").rename(columns=UNITS)
        dec = dec.rename(columns=lambda c: c if c.startswith("mean_") else f"mean_{c}")
        dec.index.name = "solution"
        df = df.merge(dec.reset_index(), on="solution", how="left")
    return {"": _cells(df)}


def _fleet_opt(a: dict) -> dict:
    """One row per fleet size, budget and method (its best-so-far held-out cost); and one per
    paired comparison, at a budget (``charged`` false) or charged with the calibration in full."""
    comps = [dict(c) for c in a["comparisons"]] + [dict(c) for c in a["charged"]]
    return {"": _frame(a["table"]), "comparisons": _frame(comps)}


_BUILDERS = {"convergence": _convergence, "convergence_curves": _convergence_curves, "fd_check": _fd_check,
             "sensitivity": _sensitivity, "opt_rates": _solutions, "placement": _solutions,
             "fleet_opt": _fleet_opt}


def tables(name: str, artifact: dict) -> dict[str, pd.DataFrame]:
    """The tidy tables of artifact ``name``: ``""`` the main one, other keys extra tables."""
    build = _BUILDERS.get(name)
    return build(artifact) if build else {"": _frame(artifact.get("table", []))}


def write_csv(name: str, artifact: dict, outputs: dict) -> list[str]:
    """Write the tables of artifact ``name`` to the rule's ``csv``/``csv_<table>`` outputs."""
    written = []
    for key, df in tables(name, artifact).items():
        path = outputs["csv" if not key else f"csv_{key}"]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=False)
        written.append(str(path))
    return written
