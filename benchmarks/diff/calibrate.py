"""Calibration of L1D and QAD (mean-field and relaxed sends) to L2-legacy, in three parts:

* ``targets`` (one job per point set and fleet size: ``train`` and ``heldout`` at each of the
  config's ``R``, scaled to it from the reference size ``ref_R``, ``sweep`` at ``ref_R``):
  L2-legacy KPIs at each operating point of the set (``isaac_net.core.diff.calibrate.measure``);
* ``size`` (one job per model and fleet size): that size's constants by grid search and
  Nelder-Mead on its training targets, by continuation from ``ref_R`` (``calibrate.fit_size``:
  each size's search narrowed around the fit of the size next to it, whose job it waits for),
  and its held-out loss; a calibration file of its own, which a study at that size reads;
* ``fit`` (one job per model): the sizes' fits as one file, the training loss of the ways to
  serve a size (its own fit, the reference size's constants, interpolation between its
  neighbours), and the model's KPIs on the load sweep uncalibrated and calibrated;
* ``merge``: the calibration file ``calibration.json`` (loadable with
  ``Calibration.load(path, mode=, sends=)``, which gives the constants for any R) with a
  summary, the tables and the figure: the constants against R, and L2-legacy against the
  uncalibrated and calibrated models across load.
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



def point_set(params: dict, R: int, name: str) -> tuple:
    """The operating points of set ``name`` at ``R`` robots per cell: ``train`` and ``heldout`` (p x
    sizes x tx at the reference size ``ref_R``, scaled to ``R``: ``calibrate.scaled_points``) or
    ``sweep`` (the figure's, at ``ref_R`` only)."""
    from isaac_net.core.diff import calibrate

    section = {"train": "grid", "heldout": "heldout", "sweep": "sweep"}[name]
    g = params[section]
    points = calibrate.product_grid(g["p"], g["sizes_bytes"], g["tx_dbm"])
    return points if name == "sweep" else calibrate.scaled_points(points, R, ref_R=int(params["ref_R"]))


def fleet_sizes(params: dict) -> tuple:
    """The config's ``R``: the fleet sizes fitted (one set of constants each), ascending."""
    from isaac_net.core.diff import calibrate

    sizes = tuple(sorted(calibrate.fleet_sizes(params["R"])))
    if int(params["ref_R"]) not in sizes:
        raise ValueError(f"ref_R: expected one of the fleet sizes R = {list(sizes)}, got {params['ref_R']!r}")
    return sizes


def _problem(params: dict, part: str, R: int):
    from isaac_net.core.diff import calibrate

    # Each set has its own positions and sends: seed, seed + 1 (held out), seed + 2 (sweep).
    offset = {"train": 0, "heldout": 1, "sweep": 2}[part]
    return calibrate.problem(
        point_set(params, R, part),
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
    if int(R) not in fleet_sizes(params) or (name == "sweep" and int(R) != int(params["ref_R"])):
        raise ValueError(f"part: fleet size {R} is not one of the config's R = {list(fleet_sizes(params))} "
                         f"(the sweep: ref_R = {params['ref_R']})")
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
    """The targets ``{R: {kpi: [n_points]}}`` of every fleet size (one file each, in the order of
    ``sizes``)."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    data = [json.loads(open(p).read()) for p in paths]
    got = [d.get("R") for d in data]
    if got != list(sizes):
        raise ValueError(f"targets: expected files of the fleet sizes {list(sizes)} in order, "
                         f"got {got} ({paths})")
    return {d["R"]: {k: torch.tensor(v, dtype=torch.float64) for k, v in d["kpis"].items()} for d in data}


def _log(line: str) -> None:
    print(line, flush=True)


def _fit_kwargs(params: dict) -> dict:
    """The arguments every size's fit and the forms' losses share."""
    return dict(area_m=params["area_m"], envs=int(params["envs"]), T=int(params["T"]),
                warmup=int(params["warmup"]), seed=int(params["seed"]), lam=float(params["lam"]),
                cfg=cell_config(params.get("cell", {})), slope_weight=float(params["slope_weight"]),
                model_robots=int(params["model_robots"]), compile=bool(params["compile"]))


def fit_size(stage, params: dict, out: dict, part: str) -> None:
    """One model's fit at one fleet size (``part``: ``<mode>_<sends>-<R>``,
    ``calibrate.fit_size``): the whole search at the reference size, elsewhere narrowed around the
    neighbouring size's fit (``out["neighbour"]``, the file of the size it continues from)."""
    from isaac_net.core.diff import calibrate

    model, _, R = part.rpartition("-")
    sizes, ref = fleet_sizes(params), int(params["ref_R"])
    if not R.isdigit() or int(R) not in sizes:
        raise ValueError(f"part: expected size-<mode>_<sends>-<R> with R one of {list(sizes)}, "
                         f"got size-{part}")
    mode, sends = model.split("_", 1)
    R = int(R)
    neighbour = dict(calibrate.continuation_order(sizes, ref))[R]
    prev = None if neighbour is None else calibrate.Calibration.load(out["neighbour"], mode=mode, sends=sends)
    if prev is not None and prev.R != (neighbour,):
        raise ValueError(f"neighbour: expected the fit at R = {neighbour}, got R = {list(prev.R)} "
                         f"({out['neighbour']})")
    cal = calibrate.fit_size(
        mode, sends, R=R, neighbour=prev, grid=point_set(params, R, "train"),
        heldout=point_set(params, R, "heldout"), level=params["level"],
        tau=float(params["tau"]), search=params.get("search"), targets=_kpis(out["train"], (R,))[R],
        heldout_targets=_kpis(out["heldout"], (R,))[R], progress=_log,  # a line per choice and check
        # relaxed sends spread by their own draws
        load_spread=float(params["load_spread"][mode]) if sends == "mean_field" else 0.0,
        mf_backlog_closure=bool(params["mf_backlog_closure"]) and mode == "QA" and sends == "mean_field",
        qa_reshare=float(params["qa_reshare"]) if (mode, sends) == ("QA", "relaxed") else 0.0,
        qa_min_grant_subbands=float(params["qa_min_grant_subbands"][sends]) if mode == "QA" else 1.0,
        provenance={"stage": stage.name, "profile": stage.profile}, **_fit_kwargs(params))
    # A calibration file of its own: a study at this size needs this fit, not the model's others.
    stage.write_json(out["json"], {"format": calibrate.FORMAT, "version": calibrate.VERSION, "model": model,
                                   "R": R, "calibrations": [cal.to_dict()],
                                   "wall_fit_s": cal.setup["wall_fit_s"]})


def fit(stage, params: dict, out: dict, model: str) -> None:
    """One model's fits at every fleet size (one file each, ``fit_size``) as one calibration file;
    the training loss of the ways to serve each size (``calibrate.size_losses``); its KPIs on the
    sweep, uncalibrated and calibrated."""
    from isaac_net.core.diff import calibrate

    mode, sends = model.split("_", 1)
    cfg = cell_config(params.get("cell", {}))
    sizes, ref = fleet_sizes(params), int(params["ref_R"])
    paths = [out["sizes"]] if isinstance(out["sizes"], str) else list(out["sizes"])
    fc = calibrate.Calibration.load(paths, mode=mode, sends=sends)
    fc = fc if isinstance(fc, calibrate.FleetCalibration) else calibrate.FleetCalibration(mode, sends, (fc,))
    if fc.R != sizes:
        raise ValueError(f"sizes: expected fits at the fleet sizes {list(sizes)}, got {list(fc.R)} ({paths})")
    train = _kpis(out["train"], sizes)
    grids = {R: point_set(params, R, "train") for R in sizes}
    forms = calibrate.fleet.size_losses(fc, ref_R=ref, grids=grids, targets=train, **_fit_kwargs(params))
    cal = fc.at(ref)
    sweep, _ = _problem(params, "sweep", ref)
    sweep = sweep.first(calibrate.model_envs_for(ref, int(params["model_robots"]), int(params["envs"]),
                                                 cal.load_spread))
    curves = {}
    # Each at its own temperature: the plain model at the studies', the calibrated one at its fitted.
    for name, c, t in (("uncalibrated", cfg, float(params["tau"])), ("calibrated", cal.apply(cfg), cal.tau)):
        k = calibrate.model_kpis(mode, sends, sweep, c, tau=t, lam=float(params["lam"]),
                                 compile=bool(params["compile"]))
        curves[name] = {kk: v[0].tolist() for kk, v in k.items()}
    # A calibration file of its own (Calibration.load reads it); its fit time the sizes' (each
    # continued from its neighbour's: what a user pays for the model at every size).
    stage.write_json(out["json"], {"format": calibrate.FORMAT, "version": calibrate.VERSION, "model": model,
                                   "calibrations": fc.to_dicts(), "forms": forms, "sweep": curves,
                                   "wall_fit_s": sum(float(c.setup["wall_fit_s"]) for c in fc.fits)})


def _row(c: dict) -> dict:
    """A table row of one calibration entry (one model at one fleet size)."""
    from isaac_net.core.diff import calibrate

    cal = calibrate.Calibration.from_dict(c)  # the entry's defaults filled (an older file's, the plain rule)
    return {"model": f"{c['mode']}D {c['sends'].replace('_', '-')}", "mode": c["mode"], "sends": c["sends"],
            "R": c["R"][0], "rate_factor": c["rate_factor"], "snr_offset_db": c["snr_offset_db"],
            "sr_field": calibrate.sr_field(c["mode"]), "sr_slots": c["sr_slots"],
            "tau": cal.tau, "qa_snr_req_db": cal.qa_snr_req_db,
            "air_factor": cal.air_factor, "air_crowd_exp": cal.air_crowd_exp,
            "air_fit": c["setup"].get("air_fit"), "load_spread": cal.load_spread,
            "mf_backlog_closure": cal.mf_backlog_closure, "qa_reshare": cal.qa_reshare,
            "qa_min_grant_subbands": cal.qa_min_grant_subbands,
            "train_points": len(c["grid"]), "heldout_points": len(c["heldout_grid"]),
            "model_envs": c["setup"]["model_envs"],
            "train_loss_uncalibrated": c["uncalibrated_train_loss"], "train_loss": c["train_loss"],
            "heldout_loss_uncalibrated": c["uncalibrated_heldout_loss"], "heldout_loss": c["heldout_loss"],
            "evaluations": c["setup"]["evaluations"], "fit_s": c["setup"].get("wall_fit_s"),
            "gradient_check": c["gradient_check"]}


def _summary(params: dict, fits: list, fleet: list, sweep_l2: dict) -> dict:
    from isaac_net.core.diff import calibrate

    sizes = fleet_sizes(params)
    ref = [r for r in fleet if r["R"] == int(params["ref_R"])]
    return {"models": len(fits), "grid_points": ref[0]["train_points"],
            "heldout_points": ref[0]["heldout_points"],
            "envs_per_point": int(params["envs"]), "model_robots": int(params["model_robots"]),
            "model_envs_per_point": ref[0]["model_envs"], "R": int(params["ref_R"]),
            "fleet_sizes": len(sizes), "R_min": sizes[0], "R_max": sizes[-1], "T": int(params["T"]),
            "warmup": int(params["warmup"]), "tau": float(params["tau"]), "lam": float(params["lam"]),
            "area_lo_m": float(params["area_m"][0]), "area_hi_m": float(params["area_m"][1]),
            "sweep_points": len(sweep_l2["points"]), "p_max": calibrate.P_MAX,
            "worst_heldout_loss": max(r["heldout_loss"] for r in fleet),
            "all_improve_heldout": all(r["heldout_loss"] < r["heldout_loss_uncalibrated"] for r in fleet),
            "all_gradients_stable": all(r["gradient_check"]["stable"] for r in fleet),
            "floors_rejected": sum(len(r["gradient_check"]["rejected"]) for r in fleet),
            "max_wall_fit_s": max(f["wall_fit_s"] for f in fits), "compiled": bool(params["compile"]),
            "fit_target_s": params.get("fit_target_s"),
            # the time on air's fit (search.air_crowd_exp): the fits that ran it, and kept its constants
            "air_fits": sum(r["air_fit"] is not None for r in fleet),
            "air_kept": sum(bool(r["air_fit"] and r["air_fit"]["kept"]) for r in fleet),
            # ... and how far the search's loss (the recorded energy) was from the model's own
            "air_basis_gap": max((abs(a["basis_loss"] - a["loss"]) / abs(a["loss"]) for a in
                                  (r["air_fit"] for r in fleet) if a and "basis_loss" in a), default=None)}


def merge(stage, params: dict, out: dict) -> None:
    """The calibration file (every model at every fleet size), its summary, the table at the
    reference size, the table per fleet size with the forms compared, and the figure."""
    from isaac_net.core.diff import calibrate

    fits = [json.loads(open(p).read()) for p in out["fits"]]
    sweep_path = out["sweep"] if isinstance(out["sweep"], str) else out["sweep"][0]
    sweep_l2 = json.loads(open(sweep_path).read())
    fleet = []
    for f in fits:
        forms = {r["R"]: r for r in f["forms"]}
        for c in f["calibrations"]:
            row = _row(c)
            form = forms[row["R"]]
            fleet.append({**row, "wall_fit_s": f["wall_fit_s"], "loss_own": form["own"],
                          "loss_ref_constants": form["ref"], "loss_line": form["line"],
                          "loss_interpolated": form["between"]})
    table = [dict(r) for r in fleet if r["R"] == int(params["ref_R"])]
    # The load sweep of the figure, as a third check of the fit: its mean point loss per model.
    l2 = {k: torch.tensor(v, dtype=torch.float64) for k, v in sweep_l2["kpis"].items()}
    for r, f in zip(table, fits, strict=True):
        for name in ("uncalibrated", "calibrated"):
            curve = {k: torch.tensor(v, dtype=torch.float64) for k, v in f["sweep"][name].items()}
            key = "sweep_loss" if name == "calibrated" else "sweep_loss_uncalibrated"
            r[key] = float(calibrate.point_loss(curve, l2).mean())
    summary = _summary(params, fits, fleet, sweep_l2)
    summary["all_improve_sweep"] = all(r["sweep_loss"] < r["sweep_loss_uncalibrated"] for r in table)
    sweep = {"points": sweep_l2["points"], "L2-legacy": sweep_l2["kpis"],
             "models": {f["model"]: f["sweep"] for f in fits}}
    fig_name = None
    if "figure" in out:
        models = dict.fromkeys(r["model"] for r in fleet)
        by_model = {m: [r for r in fleet if r["model"] == m] for m in models}
        calibration_sweep(sweep, out["figure"], KPI_LABEL, fleet=by_model)
        fig_name = out["figure"].rsplit("/", 1)[-1]
    payload = {"format": calibrate.FORMAT, "version": calibrate.VERSION,
               "calibrations": [c for f in fits for c in f["calibrations"]], "summary": summary,
               "table": table,
               "fleet": fleet, "sweep": sweep, **({"figure": fig_name} if fig_name else {})}
    stage.write_json(out["json"], payload)


def main(stage, params: dict, out: dict, part: str | None = None) -> None:
    """Calibration of the fluid models to L2-legacy (parts: targets-<set>-<R>, size-<model>-<R>,
    fit-<model>, merge)."""
    kind, _, arg = (part or "").partition("-")
    if kind == "targets":
        targets(stage, params, out, arg)
    elif kind == "size":
        fit_size(stage, params, out, arg)
    elif kind == "fit":
        fit(stage, params, out, arg)
    elif kind == "merge":
        merge(stage, params, out)
    else:
        raise ValueError(f"part: expected targets-<set>-<R>, size-<model>-<R>, fit-<model> or merge, "
                         f"got {part!r}")


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
