"""Calibration of L1D and QAD (mean-field and relaxed sends) to L2-legacy, in three parts:

* ``targets`` (one job per point set and fleet size: ``train`` and ``heldout`` at each of the
  config's ``R``, ``sweep`` at the first): L2-legacy KPIs at each operating point of the set
  (``isaac_net.core.diff.calibrate.measure``);
* ``fit`` (one job per model): the constants by grid search and Nelder-Mead on the training
  targets of every fleet size, the held-out loss, and the model's KPIs on the load sweep
  uncalibrated and calibrated (``calibrate.fit``);
* ``merge``: the calibration file ``calibration.json`` (loadable with
  ``Calibration.load(path, mode=, sends=)``) with a summary, a table and the figure of
  L2-legacy against the uncalibrated and calibrated models across load.
"""

import json
import time

import torch

try:
    from _common import KPI_LABEL, cell_config, run
    from _plots import calibration_sweep
except ImportError:  # imported as benchmarks.diff.calibrate (tests)
    from benchmarks.diff._common import KPI_LABEL, cell_config, run
    from benchmarks.diff._plots import calibration_sweep



def point_sets(params: dict) -> dict:
    """The operating points of each set: ``train``, ``heldout`` and ``sweep`` (p x sizes x tx)."""
    from isaac_net.core.diff import calibrate

    def grid(g):
        return calibrate.product_grid(g["p"], g["sizes_bytes"], g["tx_dbm"])

    return {"train": grid(params["grid"]), "heldout": grid(params["heldout"]), "sweep": grid(params["sweep"])}


def fleet_sizes(params: dict) -> tuple:
    """The config's ``R``: the fleet sizes the fit runs on (the sweep at the first)."""
    from isaac_net.core.diff import calibrate

    return calibrate.fleet_sizes(params["R"])


def _problem(params: dict, part: str, R: int):
    from isaac_net.core.diff import calibrate

    # Each set has its own positions and sends: seed, seed + 1 (held out), seed + 2 (sweep).
    offset = {"train": 0, "heldout": 1, "sweep": 2}[part]
    return calibrate.problem(
        point_sets(params)[part],
        R=int(R),
        area_m=params["area_m"],
        envs=int(params["envs"]),
        T=int(params["T"]),
        warmup=int(params["warmup"]),
        seed=int(params["seed"]) + offset,
        dtype=getattr(torch, params["dtype"]),
    ), offset


def targets(stage, params: dict, out: dict, part: str) -> None:
    """L2-legacy KPIs at the points of one set, for one fleet size (``part``: ``<set>-<R>``)."""
    from isaac_net.core.diff import calibrate

    name, _, R = part.partition("-")
    if name not in ("train", "heldout", "sweep") or not R.isdigit():
        raise ValueError(f"part: expected targets-<set>-<R> (set train, heldout or sweep), "
                         f"got targets-{part}")
    if int(R) not in fleet_sizes(params):
        raise ValueError(f"part: fleet size {R} is not one of the config's R = {list(fleet_sizes(params))}")
    prob, offset = _problem(params, name, int(R))
    t0 = time.perf_counter()
    kpis = calibrate.measure(
        prob,
        level=params["level"],
        cfg=cell_config(params.get("cell", {})),
        seed=int(params["seed"]) + offset,
    )
    print(
        f"[calibrate] {name} at R = {R}: {len(prob.points)} points x {prob.envs} envs "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    stage.write_json(
        out["json"],
        {"part": name, "R": int(R), "points": prob.points, "kpis": {k: v.tolist() for k, v in kpis.items()}},
    )


def _kpis(paths, sizes: tuple) -> dict:
    """The targets of every fleet size (one file each, in the order of ``sizes``) as one set of points."""
    from isaac_net.core.diff import calibrate

    paths = [paths] if isinstance(paths, str) else list(paths)
    data = [json.loads(open(p).read()) for p in paths]
    got = [d.get("R") for d in data]
    if got != list(sizes):
        raise ValueError(f"targets: expected files of the fleet sizes {list(sizes)} in order, "
                         f"got {got} ({paths})")
    return calibrate.concat_points(
        {k: torch.tensor(v, dtype=torch.float64) for k, v in d["kpis"].items()} for d in data
    )


def _log(line: str) -> None:
    print(line, flush=True)


def fit(stage, params: dict, out: dict, model: str) -> None:
    """Fit one model's constants; its KPIs on the sweep, uncalibrated and calibrated."""
    from isaac_net.core.diff import calibrate

    mode, sends = model.split("_", 1)
    cfg = cell_config(params.get("cell", {}))
    sets = point_sets(params)
    sizes = fleet_sizes(params)
    t0 = time.perf_counter()
    cal = calibrate.fit(
        mode,
        sends,
        level=params["level"],
        grid=sets["train"],
        heldout=sets["heldout"],
        R=sizes,
        area_m=params["area_m"],
        envs=int(params["envs"]),
        model_envs=int(params["model_envs"]),
        T=int(params["T"]),
        warmup=int(params["warmup"]),
        tau=float(params["tau"]),
        lam=float(params["lam"]),
        seed=int(params["seed"]),
        cfg=cfg,
        search=params.get("search"),
        slope_weight=float(params["slope_weight"]),
        targets=_kpis(out["train"], sizes),
        heldout_targets=_kpis(out["heldout"], sizes),
        progress=_log,  # a line per grid choice, refinement and gradient check
        provenance={"stage": stage.name, "profile": stage.profile},
    )
    wall_fit = time.perf_counter() - t0
    sweep, _ = _problem(params, "sweep", sizes[0])
    sweep = sweep.first(int(params["model_envs"]))
    curves = {}
    # Each at its own temperature: the plain model at the studies', the calibrated one at its fitted.
    for name, c, t in (("uncalibrated", cfg, float(params["tau"])), ("calibrated", cal.apply(cfg), cal.tau)):
        k = calibrate.model_kpis(mode, sends, sweep, c, tau=t, lam=float(params["lam"]))
        curves[name] = {kk: v[0].tolist() for kk, v in k.items()}
    stage.write_json(
        out["json"], {"model": model, "calibration": cal.to_dict(), "sweep": curves, "wall_fit_s": wall_fit}
    )


def merge(stage, params: dict, out: dict) -> None:
    """The calibration file, its summary and table, and the figure."""
    from isaac_net.core.diff import calibrate

    fits = [json.loads(open(p).read()) for p in out["fits"]]
    sweep_path = out["sweep"] if isinstance(out["sweep"], str) else out["sweep"][0]  # the first fleet size's
    sweep_l2 = json.loads(open(sweep_path).read())
    table, summary = (
        [],
        {
            "models": len(fits),
            "grid_points": len(fits[0]["calibration"]["grid"]),
            "heldout_points": len(fits[0]["calibration"]["heldout_grid"]),
            "envs_per_point": int(params["envs"]),
            "model_envs_per_point": int(params["model_envs"]),
            "R": fleet_sizes(params)[0],  # the sweep's; the fit's fleet sizes are the config's R
            "fleet_sizes": len(fleet_sizes(params)),
            "T": int(params["T"]),
            "warmup": int(params["warmup"]),
            "tau": float(params["tau"]),
            "lam": float(params["lam"]),
            "area_lo_m": float(params["area_m"][0]),
            "area_hi_m": float(params["area_m"][1]),
        },
    )
    for f in fits:
        c = f["calibration"]
        table.append(
            {
                "model": f"{c['mode']}D {c['sends'].replace('_', '-')}",
                "mode": c["mode"],
                "sends": c["sends"],
                "rate_factor": c["rate_factor"],
                "snr_offset_db": c["snr_offset_db"],
                "sr_field": calibrate.sr_field(c["mode"]),
                "sr_slots": c["sr_slots"],
                "tau": calibrate.Calibration.from_dict(c).tau,
                "qa_snr_req_db": c.get("qa_snr_req_db"),
                "train_loss_uncalibrated": c["uncalibrated_train_loss"],
                "train_loss": c["train_loss"],
                "heldout_loss_uncalibrated": c["uncalibrated_heldout_loss"],
                "heldout_loss": c["heldout_loss"],
                "evaluations": c["setup"]["evaluations"],
                "wall_fit_s": f["wall_fit_s"],
                "gradient_check": c["gradient_check"],
            }
        )
    # The load sweep of the figure, as a third check of the fit: its mean point loss per model.
    l2 = {k: torch.tensor(v, dtype=torch.float64) for k, v in sweep_l2["kpis"].items()}
    for r, f in zip(table, fits, strict=True):
        for name in ("uncalibrated", "calibrated"):
            curve = {k: torch.tensor(v, dtype=torch.float64) for k, v in f["sweep"][name].items()}
            key = "sweep_loss" if name == "calibrated" else "sweep_loss_uncalibrated"
            r[key] = float(calibrate.point_loss(curve, l2).mean())
    summary["all_improve_sweep"] = all(r["sweep_loss"] < r["sweep_loss_uncalibrated"] for r in table)
    summary["sweep_points"] = len(sweep_l2["points"])
    summary["worst_heldout_loss"] = max(r["heldout_loss"] for r in table)
    summary["all_improve_heldout"] = all(r["heldout_loss"] < r["heldout_loss_uncalibrated"] for r in table)
    summary["all_gradients_stable"] = all(r["gradient_check"]["stable"] for r in table)
    summary["floors_rejected"] = sum(len(r["gradient_check"]["rejected"]) for r in table)
    sweep = {
        "points": sweep_l2["points"],
        "L2-legacy": sweep_l2["kpis"],
        "models": {f["model"]: f["sweep"] for f in fits},
    }
    fig_name = None
    if "figure" in out:
        calibration_sweep(sweep, out["figure"], KPI_LABEL)
        fig_name = out["figure"].rsplit("/", 1)[-1]
    payload = {
        "format": calibrate.FORMAT,
        "version": calibrate.VERSION,
        "calibrations": [f["calibration"] for f in fits],
        "summary": summary,
        "table": table,
        "sweep": sweep,
        **({"figure": fig_name} if fig_name else {}),
    }
    stage.write_json(out["json"], payload)


def main(stage, params: dict, out: dict, part: str | None = None) -> None:
    """Calibration of the fluid models to L2-legacy (parts: targets-<set>-<R>, fit-<model>, merge)."""
    kind, _, arg = (part or "").partition("-")
    if kind == "targets":
        targets(stage, params, out, arg)
    elif kind == "fit":
        fit(stage, params, out, arg)
    elif kind == "merge":
        merge(stage, params, out)
    else:
        raise ValueError(f"part: expected targets-<set>-<R>, fit-<model> or merge, got {part!r}")


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
