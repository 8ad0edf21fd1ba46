"""Gradients against black-box optimisers on the packet level (issue #35): per-robot send
probability and transmit power of a heterogeneous fleet (``isaac_net.optimise``), at several fleet
sizes, every solution scored on L2-legacy with held-out sends.

Three parts, one per rule (``params.part``):

* ``gradient-<R>`` (rule ``fleet_opt_gradient``): Adam through each calibrated model of ``models``
  (each reported with its own wall time) and the best uniform policy. The gradient used in the
  comparisons is the model of ``choose_from`` whose solution has the lowest training-sends cost on
  the level (one rollout of the cells per candidate): it is charged every candidate's run and the
  choice, and that sum is the budget unit ``t_grad`` of the fleet size. Also the calibration's own
  cost (the L2-legacy targets' wall time and the candidates' fit times, from the calibrate stage).
* ``blackbox-<R>-<method>`` (rule ``fleet_opt_blackbox``; cmaes, tpe, random, hybrid): one method on
  the level with the wall budget ``budget_factor x t_grad`` (the methods of
  ``cover_calibration_methods`` at the sizes of ``cover_calibration_R``: ``cover_wall_s`` from the
  pipeline's start, without waiting for the gradient job, long enough for the comparisons charged in
  full: ``_fleet_budget.covers_calibration``). The hybrid starts at the chosen gradient's solution,
  charged for it.
* ``merge`` (rule ``fleet_opt``): the traces sliced at the budgets (``budgets`` x ``t_grad``, and
  x each model's own wall time), the paired differences, the comparisons charged in full, the
  break-even, the uniform policy against the best per-robot solution, the targets, and the figure.

At a budget, a method's solution is the one it stands at when the budget runs out, its own pick
made without the held-out sends (``isaac_net.optimise.solution_at``): the same rule for every
method; a black-box job that ended before a budget has no solution there ("not run that long").
"""

import json
import math
import time
from pathlib import Path

import torch

try:
    from _common import cell_config, run
    from _fleet_budget import covers_calibration, proxy_is_candidate
    from _plots import fleet_opt as plot_fleet_opt
except ImportError:  # imported as benchmarks.diff.fleet_opt (tests)
    from benchmarks.diff._common import cell_config, run
    from benchmarks.diff._fleet_budget import covers_calibration, proxy_is_candidate
    from benchmarks.diff._plots import fleet_opt as plot_fleet_opt

#: The black-box methods, each its own job, by the part's name.
BLACKBOX = {
    "cmaes": "CMA-ES",
    "tpe": "TPE (Optuna)",
    "random": "random search",
    "hybrid": "hybrid (gradient + CMA-ES)",
}
GRADIENT = "gradient (chosen model)"
PROXY = "proxy"  # the model job of the neural proxy (fleet_opt.proxy), fitted in the job
UNIFORM = "uniform policy"
#: The baselines every gradient comparison is made against, and who is compared.
BASELINES = ("CMA-ES", "TPE (Optuna)")
CHALLENGERS = (GRADIENT, "hybrid (gradient + CMA-ES)")


# ------------------------------------------------------------------------------ the problem
def problem(params: dict, R: int):
    """The fleet of ``R`` robots per cell, its decisions and the scorer on the level."""
    from isaac_net import optimise as opt

    fleet = opt.make_fleet(
        E=int(params["E"]),
        R=int(R),
        T=int(params["T_eval"]),
        seed=int(params["seed"]),
        dtype=getattr(torch, params["dtype"]),
    )
    cfg = cell_config(params.get("cell", {}))
    scorer = opt.Scorer(
        fleet,
        params["cost"],
        T=int(params["T_eval"]),
        warmup=int(params["warmup_eval"]),
        level=params["level"],
        cfg=cfg,
        seed=int(params["seed"]),
    )
    # Every method starts at the same point: p_init at p_init_ref_R robots per cell, scaled to R (the
    # same offered load per cell at every size; a fixed p would start a 64-robot cell deep in overload).
    p0 = min(float(params["p_init"]) * int(params["p_init_ref_R"]) / int(R), float(params["p_init"]))
    dec = opt.FleetDecisions(fleet, p_init=p0, tx_init_dbm=float(params["tx_init_dbm"]),
                             p_scale=params.get("p_scale", "log"))
    return fleet, dec, scorer, cfg


def model_name(m: dict) -> str:
    return f"gradient, {m['mode']}D {m['sends'].replace('_', '-')}, calibrated"


def dump(res) -> dict:
    """A :class:`~isaac_net.optimise.Result` as JSON (decisions left out)."""
    return {
        "name": res.name,
        "wall_s": res.wall_s,
        "rollouts": res.rollouts,
        "heldout_cells": res.heldout_cost.tolist(),
        "trace": res.trace,
        "info": res.info,
    }


def calibration_times(targets: list, fits: list) -> dict:
    """The calibrate stage's records, each file read once: ``targets_s``, the wall time of its L2-legacy
    targets (train and held-out points, every fleet size; the load sweep is the figure's, not counted),
    and ``fits``, the fit records (``wall_fit_s`` among them) by model (``<mode>_<sends>``)."""
    t = [json.loads(open(p).read()) for p in targets]
    targets_s = sum(d["provenance"]["wall_s"] for d in t if d.get("part") in ("train", "heldout"))
    fit = {d["model"]: d for d in (json.loads(open(p).read()) for p in fits)}
    return {"targets_s": targets_s, "fits": fit}


def calibration_cost(times: dict, models: list) -> dict:
    """The calibration's wall time, s, of ``models`` (``<mode>_<sends>``): the targets of ``times``
    (:func:`calibration_times`) and the models' fits (every size by continuation; None where a fit is
    not recorded)."""
    found = [times["fits"][m] for m in models if m in times["fits"]]
    fit_s = sum(float(d["wall_fit_s"]) for d in found) if len(found) == len(models) else None
    return {
        "targets_s": times["targets_s"],
        "fit_s": fit_s,
        "total_s": None if fit_s is None else times["targets_s"] + fit_s,
        "models": list(models),
    }


def with_proxy_fit(cost: dict, proxy_cost: dict | None) -> dict:
    """The calibrated candidates' calibration cost (:func:`calibration_cost`) with the proxy's fit
    (its job's ``calibration_cost``) added, where the proxy is a candidate too."""
    if proxy_cost is None:
        return cost
    fit_s = None if cost["fit_s"] is None else cost["fit_s"] + proxy_cost["fit_s"]
    return {**cost, "fit_s": fit_s, "total_s": None if fit_s is None else cost["targets_s"] + fit_s,
            "models": [*cost["models"], PROXY], "proxy_fit_s": proxy_cost["fit_s"],
            "proxy_rollouts": proxy_cost.get("rollouts")}


def _model_key(m: dict) -> str:
    return f"{m['mode']}_{m['sends']}"


def _fit_file(out: dict, key: str) -> str:
    """The calibrate stage's fit file of model ``key`` (``<mode>_<sends>``) among ``out["fits"]``."""
    fits = [out["fits"]] if isinstance(out["fits"], str) else list(out["fits"])
    match = [p for p in fits if p.rsplit("/", 1)[-1] == f"fit_{key}.json"]
    if len(match) != 1:
        raise ValueError(f"fits: expected one fit_{key}.json, got {fits}")
    return match[0]


def _gradient(scorer, dec, cfg, params: dict, m: dict, out: dict):
    """Adam through the calibrated model ``m`` (``{mode, sends}``; its fit file among ``out["fits"]``)."""
    from isaac_net import optimise as opt
    from isaac_net.core.diff.calibrate import Calibration

    g = params["gradient"]
    cal = Calibration.load(_fit_file(out, _model_key(m)), mode=m["mode"], sends=m["sends"])
    res = opt.gradient(
        dec,
        scorer,
        opt.Budget(wall_s=float(g.get("max_wall_s", 1e9))),
        calibration=cal,
        cfg=cfg,
        iters=int(g["iters"]),
        lr=float(g["lr"]),
        T=int(g["T"]),
        warmup=int(g["warmup"]),
        tau_start=float(g["tau_start"]),
        tau_end=float(g["tau_end"]),
        lam=float(g["lam"]),
        score_every=int(g["score_every"]),
        seed=int(params["seed"]),
        name=model_name(m),
        compile=bool(m.get("compile", g.get("compile", False))),
    )
    print(f"[fleet_opt] R = {dec.fleet.R}: {res.name} {res.wall_s:.1f} s, "
          f"held-out {float(res.heldout_cost.mean()):.3f}", flush=True)
    return res


def candidates(params: dict) -> list:
    """The models the comparisons' gradient is chosen among (``choose_from``, default every model),
    as their entries of ``models``."""
    keys = [_model_key(m) for m in params["models"]]
    pool = {_model_key(m) for m in params.get("choose_from", params["models"])}
    if not pool or not pool <= set(keys):
        raise ValueError(f"choose_from: expected a non-empty subset of models {keys}, got {sorted(pool)}")
    return [m for m in params["models"] if _model_key(m) in pool]


def _proxy_run(out: dict, dec, R: int):
    """The proxy job's run at fleet size ``R`` (``out["proxy"]``) as a candidate: its
    :class:`~isaac_net.optimise.methods.Result` (the decisions it stored) and its fit's cost."""
    from isaac_net.optimise.methods import Result

    job = json.loads(open(out["proxy"]).read())
    if job.get("R") != R or job.get("model") != PROXY or "decisions" not in job:
        raise ValueError(f"proxy: expected the proxy job of R = {R} with its decisions, got R = "
                         f"{job.get('R')}, model {job.get('model')!r} ({out['proxy']})")
    f, r = dec.fleet, job["result"]
    decisions = {k: torch.tensor(job["decisions"][k], dtype=f.B.dtype, device=f.B.device)
                 for k in ("p", "tx_dbm")} | {"B": f.B, "pos": f.pos}
    res = Result(r["name"], decisions, torch.tensor(r["heldout_cells"], dtype=torch.float64), r["wall_s"],
                 r["rollouts"], r["trace"], r["info"])
    return res, job["calibration_cost"]


def gradient_part(stage, params: dict, out: dict, R: int) -> None:
    """The candidate gradients, the chosen one and the uniform policy at fleet size ``R``.

    The gradient of the comparisons is chosen among ``choose_from`` and, with ``proxy.candidate``,
    the neural proxy (its job's run, ``out["proxy"]``), by the solutions' training-sends cost on the
    level, so it is charged all of their runs and the choice: its wall time ``t_grad`` is their sum,
    its calibration every candidate's (the proxy's fit among them), and its trace has two rows, the
    start and the chosen solution at ``t_grad`` (before every candidate ran, none of them is the
    chosen one). The other models run in their own jobs (:func:`model_part`)."""
    from isaac_net import optimise as opt

    fleet, dec, scorer, cfg = problem(params, R)
    pool = candidates(params)
    runs = {}
    for m in pool:
        res = _gradient(scorer, dec, cfg, params, m, out)
        runs[res.name] = (m, res)
    proxy_cost = None
    if proxy_is_candidate(params):
        res, proxy_cost = _proxy_run(out, dec, R)
        runs[res.name] = ({"model": PROXY}, res)
    # The choice among the candidates, on the training sends (what the black-box methods see), charged.
    r0, t0 = scorer.rollouts, time.perf_counter()
    train = {name: float(scorer.train(res.decisions).mean()) for name, (_, res) in runs.items()}
    select_s, select_rollouts = time.perf_counter() - t0, scorer.rollouts - r0
    chosen = min(train, key=train.get)
    m, res = runs[chosen]
    t_grad = sum(r.wall_s for _, r in runs.values()) + select_s
    trace = [dict(res.trace[0]), {**res.trace[-1], "wall_s": t_grad, "rollouts": select_rollouts}]
    uniform = opt.uniform_policy(dec, scorer, grid=params.get("uniform"))
    times = calibration_times(out["targets"], out["fits"])
    own_cost = {n: proxy_cost if mm.get("model") == PROXY else calibration_cost(times, [_model_key(mm)])
                for n, (mm, _) in runs.items()}
    payload = {
        "R": int(R),
        "E": fleet.E,
        "chosen": chosen,
        "chosen_model": m,
        "choose_from": list(runs),
        "t_grad_s": t_grad,
        "select_s": select_s,
        "select_rollouts": select_rollouts,
        "train_cost": train,
        "x_chosen": dec.to_unit(res.decisions).tolist(),
        "p_scale": dec.p_scale,  # the cube x_chosen is on (the hybrid reads it back)
        "calibration_cost": with_proxy_fit(calibration_cost(times, [_model_key(mm) for mm in pool]),
                                           proxy_cost),
        "model_calibration_cost": own_cost,
        "results": {name: dump(r) for name, (_, r) in runs.items()}
        | {GRADIENT: {**dump(res), "trace": trace, "wall_s": t_grad, "rollouts": select_rollouts}}
        | {UNIFORM: dump(uniform)},
    }
    stage.write_json(out["json"], payload)


def proxy_part(stage, params: dict, out: dict, R: int) -> None:
    """The neural proxy at fleet size ``R``: fitted on the level over the fleet's ranges, then Adam
    through it (the gradient settings' ``iters``, ``lr``, ``score_every``), by
    ``isaac_net.optimise.proxy_gradient``; the fit's rollouts and wall time are its own cost, as a
    calibration's."""
    from isaac_net import optimise as opt

    pp, g = params["proxy"], params["gradient"]
    _, dec, scorer, _ = problem(params, R)
    fit = {"robots": int(pp["robots"]), "test_share": float(pp["test_share"]), "T": int(pp["T"]),
           "warmup": int(pp["warmup"]), "load_max": float(pp["load_max"]), "hidden": pp["hidden"],
           "epochs": int(pp["epochs"]), "lr": float(pp["lr"]), "batch_size": int(pp["batch_size"]),
           "batch_cells": pp.get("batch_cells")}
    res = opt.proxy_gradient(dec, scorer, opt.Budget(wall_s=float(g.get("max_wall_s", 1e9))),
                             seed=int(params["seed"]), iters=int(g["iters"]), lr=float(g["lr"]),
                             score_every=int(g["score_every"]), fit=fit)
    info = res.info.pop("fit")  # the job's "proxy", its result as the other models' (fit aside)
    print(f"[fleet_opt] R = {R}: {res.name} {res.wall_s:.1f} s (fit {info['wall_s']:.1f} s), "
          f"held-out {float(res.heldout_cost.mean()):.3f}", flush=True)
    cal = {"targets_s": None, "fit_s": info["wall_s"], "total_s": info["wall_s"], "models": [PROXY],
           "rollouts": info["rollouts"], "kind": "proxy"}
    # its solution too: the gradient job chooses among it where the proxy is a candidate
    decisions = {k: res.decisions[k].detach().cpu().tolist() for k in ("p", "tx_dbm")}
    stage.write_json(out["json"], {"R": int(R), "model": PROXY, "result": dump(res), "calibration_cost": cal,
                                   "proxy": info, "decisions": decisions})


def model_part(stage, params: dict, out: dict, R: int, key: str) -> None:
    """One calibrated model outside the candidates (``<mode>_<sends>``) at fleet size ``R``, at its
    own wall time."""
    match = [m for m in params["models"] if _model_key(m) == key]
    if len(match) != 1 or key in {_model_key(m) for m in candidates(params)}:
        raise ValueError(f"model: expected one of models outside choose_from, got {key!r}")
    _, dec, scorer, cfg = problem(params, R)
    res = _gradient(scorer, dec, cfg, params, match[0], out)
    cal = calibration_cost(calibration_times(out["targets"], [out["fits"]]), [key])
    stage.write_json(out["json"], {"R": int(R), "model": key, "result": dump(res), "calibration_cost": cal})


def blackbox_budget(params: dict, R: int, method: str, gradient_path: str) -> tuple[float, dict | None]:
    """The wall budget of ``method`` at fleet size ``R``, s, and the gradient job it read (None where
    it read none): ``cover_wall_s`` where the job covers the calibration
    (:func:`_fleet_budget.covers_calibration`; the gradient job at ``gradient_path`` is not read),
    otherwise ``budget_factor`` times that job's ``t_grad``."""
    if covers_calibration(params, R, method):
        if method == "hybrid":
            raise ValueError("cover_calibration_methods: the hybrid starts at the gradient's solution, it "
                             "cannot run from the pipeline's start")
        return float(params["cover_wall_s"]), None
    grad = json.loads(Path(gradient_path).read_text())
    if grad is None:
        raise ValueError(f"{gradient_path}: the gradient job of R = {R} sets {method}'s budget, got none")
    if grad["R"] != R:
        raise ValueError(f"{gradient_path}: expected the gradient job of R = {R}, got R = {grad['R']}")
    return float(params["budget_factor"]) * grad["t_grad_s"], grad


def blackbox_part(stage, params: dict, out: dict, R: int, method: str) -> None:
    """One black-box method at fleet size ``R`` within its budget (:func:`blackbox_budget`)."""
    from isaac_net import optimise as opt
    from isaac_net.optimise.methods import Result

    if method not in BLACKBOX:
        raise ValueError(f"method: unknown {method!r}; expected one of: {', '.join(BLACKBOX)}")
    budget_s, grad = blackbox_budget(params, R, method, out["gradient"])
    fleet, dec, scorer, _ = problem(params, R)
    budget = opt.Budget(wall_s=budget_s)
    seed, every = int(params["seed"]), params["score_every"]
    if method == "cmaes":
        res = opt.cmaes(dec, scorer, budget, seed=seed, score_every=int(every["cmaes"]))
    elif method == "tpe":
        res = opt.tpe(
            dec,
            scorer,
            budget,
            seed=seed,
            score_every=int(every["tpe"]),
            trials_per_round=int(params["tpe_trials_per_round"]),
        )
    elif method == "random":
        res = opt.random_search(
            dec,
            scorer,
            budget,
            seed=seed,
            score_every=int(every["random"]),
            per_round=int(params["random_per_round"]),
        )
    else:
        if grad.get("p_scale") != dec.p_scale:
            raise ValueError(
                f"gradient: x_chosen is on p_scale {grad.get('p_scale')!r}, this job's is {dec.p_scale!r}"
            )
        g = grad["results"][GRADIENT]
        start = Result(
            grad["chosen"],
            dec.from_unit(torch.tensor(grad["x_chosen"], dtype=torch.float64)),
            torch.tensor(g["heldout_cells"], dtype=torch.float64),
            g["wall_s"],
            g["rollouts"],
            [],
        )
        res = opt.hybrid(
            dec,
            scorer,
            budget,
            start,
            sigma0=float(params["hybrid_sigma0"]),
            seed=seed,
            score_every=int(every["hybrid"]),
        )
        res.name = BLACKBOX["hybrid"]
    print(
        f"[fleet_opt] R = {R}: {res.name} {res.wall_s:.1f} s of {budget.wall_s:.1f}, "
        f"{res.rollouts} rollouts, "
        f"held-out {float(res.heldout_cost.mean()):.3f}",
        flush=True,
    )
    stage.write_json(
        out["json"],
        {
            "R": int(R),
            "method": method,
            "budget_s": budget.wall_s,
            "result": {**dump(res), "name": BLACKBOX[method]},
        },
    )


# ------------------------------------------------------------------------------ the merge
def _at(trace: list, wall_s: float) -> dict | None:
    from isaac_net.optimise import solution_at

    return solution_at(trace, wall_s=wall_s)


def paired(a: list, b: list, n_boot: int, seed: int) -> dict:
    """Paired difference ``a - b`` over cells: mean, bootstrap 95 % interval, share of cells where
    ``a`` costs less, and the verdict (better / worse: the interval below / above 0)."""
    from isaac_net.optimise import paired_diff

    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    mean, lo, hi = paired_diff(ta, tb, n_boot, seed)
    return {
        "diff": mean,
        "lo": lo,
        "hi": hi,
        "better_cells": float((ta < tb).double().mean()),
        "verdict": "better" if hi < 0 else ("worse" if lo > 0 else "tie"),
    }


def break_even(trace: list, cost: float, after_s: float) -> float | None:
    """The first wall time (s) at which the solution of ``trace`` (the method's own pick) costs at
    most ``cost`` held out, from ``after_s`` on (None: never within the trace)."""
    for r in trace:
        if r["heldout_cost"] <= cost:
            return max(r["wall_s"], after_s)
    return None


def _ran(ends: dict, name: str, budget: float) -> bool:
    """Whether method ``name`` ran as long as ``budget`` (s): a finished gradient's solution stays its
    solution; a black-box job's (``ends``: its budget, s) is only known as far as it ran."""
    return name not in ends or budget <= ends[name] * (1 + 1e-9)


def _at_budgets(results: dict, ends: dict, params: dict, R: int, t_grad: float) -> tuple[list, list]:
    """Each method's solution at each budget (rows) and the paired comparisons of the challengers
    against the baselines there (calibration amortised)."""
    n_boot, seed = int(params["n_boot"]), int(params["seed"])
    rows, comps = [], []
    for factor in params["budgets"]:
        budget = float(factor) * t_grad
        at = {n: _at(r["trace"], budget) if _ran(ends, n, budget) else None
              for n, r in results.items() if n != UNIFORM}
        for name, row in at.items():
            rows.append({"R": R, "budget_factor": factor, "budget_s": budget, "method": name,
                         "ran": _ran(ends, name, budget),
                         "cost": None if row is None else row["heldout_cost"],
                         "wall_s": None if row is None else row["wall_s"],
                         "rollouts": None if row is None else row["rollouts"]})
        for ch in CHALLENGERS:
            for base in BASELINES:
                if at.get(ch) is None or at.get(base) is None:
                    continue
                comps.append({"R": R, "budget_factor": factor, "budget_s": budget, "method": ch,
                              "baseline": base, "charged": False,
                              **paired(at[ch]["heldout_cells"], at[base]["heldout_cells"], n_boot, seed)})
    return rows, comps


def _pair_at(results: dict, params: dict, name: str, own_s: float | None, base: str, base_s: float) -> dict:
    """Method ``name``'s solution at ``own_s`` (s; None: its final one) against ``base``'s at
    ``base_s``: ``measured`` False where either had recorded none by then (a run whose first trace
    row came later), else the baseline's cost and the paired difference (:func:`paired`)."""
    a = results[name] if own_s is None else _at(results[name]["trace"], own_s)
    b = _at(results[base]["trace"], base_s)
    if a is None or b is None:
        return {"measured": False, "unrecorded": name if a is None else base}
    return {"measured": True, "baseline_cost": b["heldout_cost"],
            **paired(a["heldout_cells"], b["heldout_cells"], int(params["n_boot"]), int(params["seed"]))}


def _vs_baselines(results: dict, ends: dict, params: dict, name: str, at_s: float, **row) -> list:
    """Method ``name``'s solution against each baseline's at ``at_s`` (s) of the baseline's run: one
    row each (``row``'s fields, ``baseline``, ``covered`` False where the baseline's job ended before,
    and where covered :func:`_pair_at`'s fields)."""
    out = []
    for base in BASELINES:
        if base not in results:
            continue
        r = {**row, "baseline": base, "covered": at_s <= ends[base], "measured": False}
        if r["covered"]:
            r |= _pair_at(results, params, name, None, base, at_s)
        out.append(r)
    return out


def _own_time(results: dict, ends: dict, params: dict, name: str) -> list:
    """One model's solution against each baseline at ``budgets`` x the model's own wall time (what a
    user who runs only this model pays)."""
    out = []
    for factor in params["budgets"]:
        budget = float(factor) * results[name]["wall_s"]
        out += _vs_baselines(results, ends, params, name, budget, budget_factor=factor, budget_s=budget)
    return out


def _own_charged(results: dict, ends: dict, params: dict, name: str, cal) -> list:
    """One model's solution plus its calibration (or proxy fit) against each baseline given that
    total wall time."""
    if cal is None:
        return []
    total = results[name]["wall_s"] + cal
    return _vs_baselines(results, ends, params, name, total, total_s=total)


def _charged(results: dict, ends: dict, params: dict, R: int, t_grad: float, cal) -> list:
    """Charged in full: the gradient (at t_grad) and the hybrid (at its whole budget) plus the
    calibration's time, against each baseline given that total (where the baseline ran that long)."""
    charged = []
    top = float(params["budget_factor"]) * t_grad
    for ch, own_s in ((GRADIENT, t_grad), (BLACKBOX["hybrid"], top)):
        for base in BASELINES:
            if ch not in results or base not in results or cal is None:
                continue
            total = own_s + cal
            row = {"R": R, "method": ch, "baseline": base, "charged": True, "own_s": own_s,
                   "calibration_s": cal, "total_s": total, "baseline_ran_s": ends[base],
                   "covered": ends[base] >= total, "measured": False}
            if row["covered"]:
                row |= _pair_at(results, params, ch, own_s, base, total)
            charged.append(row)
    return charged


def _break_even(results: dict, ends: dict, R: int, t_grad: float, cal) -> list:
    """When each baseline's solution first reaches the gradient's cost, and so the calibration time
    the gradient could be charged and still win, and the fleets to amortise it over."""
    g_cost = _at(results[GRADIENT]["trace"], t_grad)["heldout_cost"]
    even = []
    for base in BASELINES:
        if base not in results:
            continue
        t = break_even(results[base]["trace"], g_cost, 0.0)
        slack = None if t is None else t - t_grad
        reach = ends[base] - t_grad  # the slack is at least this where the baseline never reached it
        even.append({
            "R": R, "baseline": base, "gradient_cost": g_cost, "reached_s": t, "ran_s": ends[base],
            "slack_s": slack, "slack_at_least_s": reach if t is None else None, "calibration_s": cal,
            "fleets_to_amortise": (None if cal is None or slack is None or slack <= 0
                                   else math.ceil(cal / slack)),
            "fleets_to_amortise_at_most": (None if cal is None or t is not None or reach <= 0
                                           else math.ceil(cal / reach)),
            "never_pays": slack is not None and slack <= 0,
            "pays_in_one_run": cal is not None and (slack if t is not None else reach) >= cal})
    return even


def _uniform_vs_best(results: dict, ranked: list, params: dict, R: int) -> dict:
    """The uniform policy against the best per-robot solution found (the lowest held-out cost at
    the largest budget, among the methods compared)."""
    n_boot, seed = int(params["n_boot"]), int(params["seed"])
    best = min((r for r in ranked if r["budget_factor"] == max(params["budgets"])), key=lambda r: r["cost"])
    best_cells = _at(results[best["method"]]["trace"], best["budget_s"])["heldout_cells"]
    uni = results[UNIFORM]
    uniform = {"R": R, "method": best["method"], "cost": best["cost"],
               "uniform_cost": float(sum(uni["heldout_cells"]) / len(uni["heldout_cells"])),
               "p": uni["info"]["p"], "tx_dbm": uni["info"]["tx_dbm"],
               **paired(uni["heldout_cells"], best_cells, n_boot, seed)}
    uniform["clearly_worse"] = uniform["lo"] > 0
    uniform["worse_cells"] = float(
        sum(a > b for a, b in zip(uni["heldout_cells"], best_cells, strict=True)) / len(best_cells))
    return uniform


def compare_size(grad: dict, boxes: dict, params: dict) -> dict:
    """The comparisons at one fleet size: ``grad`` the gradient job's payload, ``boxes`` the
    black-box jobs' by method name."""
    R, t_grad = grad["R"], grad["t_grad_s"]
    results = {**grad["results"], **{b["result"]["name"]: b["result"] for b in boxes.values()}}
    ends = {b["result"]["name"]: b["budget_s"] for b in boxes.values()}
    cal = grad["calibration_cost"]["total_s"]
    rows, comps = _at_budgets(results, ends, params, R, t_grad)
    # Who wins: the methods compared (the candidates' own runs are shown, not ranked: the gradient
    # is the one chosen among them on the training sends; the other models and the proxy compete).
    ranked = [r for r in rows if r["cost"] is not None and r["method"] not in grad["train_cost"]]
    winners = [min((r for r in ranked if r["budget_factor"] == f), key=lambda r: r["cost"])
               for f in params["budgets"]]
    size = {
        "R": R, "E": grad["E"], "t_grad_s": t_grad, "chosen": grad["chosen"], "select_s": grad["select_s"],
        "select_rollouts": grad["select_rollouts"],
        "calibration_targets_s": grad["calibration_cost"]["targets_s"],
        "calibration_fit_s": grad["calibration_cost"]["fit_s"], "calibration_s": cal,
        "calibration_proxy_fit_s": grad["calibration_cost"].get("proxy_fit_s"),
        "gradients": [{"method": n, "wall_s": results[n]["wall_s"], "train_cost": grad["train_cost"].get(n),
                       "candidate": n in grad["train_cost"],
                       "cost": float(sum(results[n]["heldout_cells"]) / len(results[n]["heldout_cells"])),
                       "calibration_s": grad["model_calibration_cost"][n]["total_s"],
                       "proxy": grad["model_calibration_cost"][n].get("kind") == "proxy",
                       "own_time": _own_time(results, ends, params, n),
                       "charged": _own_charged(results, ends, params, n,
                                               grad["model_calibration_cost"][n]["total_s"])}
                      for n in grad["model_calibration_cost"]],
        "budgets_s": [{"method": m, "budget_s": ends[m]} for m in ends], "winners": winners,
        "uniform": _uniform_vs_best(results, ranked, params, R),
        "by_method": [{"method": n, "costs": [r["cost"] for r in rows if r["method"] == n],
                       "ran": [r["ran"] for r in rows if r["method"] == n]}
                      for n in results if n != UNIFORM]}
    traces = {n: [{k: v for k, v in row.items() if k != "heldout_cells"} for row in r["trace"]]
              for n, r in results.items() if n != UNIFORM}
    return {"rows": rows, "comparisons": comps, "charged": _charged(results, ends, params, R, t_grad, cal),
            "break_even": _break_even(results, ends, R, t_grad, cal), "size": size, "traces": traces}


def check_targets(t: dict, comps: list, charged: list, sizes: list) -> dict:
    """The issue's targets on the comparisons: per fleet size of ``amortised_R``, the gradient or
    the hybrid better than every baseline at ``budget`` x t_grad (interval below 0, better in at
    least ``better_cells_min`` of the cells); per size of ``charged_R``, the gradient or the hybrid
    plus the calibration better than CMA-ES at the same total (interval below 0). None: not measured
    (the size was not run, or the baseline did not run as long)."""

    def amortised(R):
        if R not in sizes:
            return None
        ok = []
        for ch in CHALLENGERS:
            rows = [
                c for c in comps if c["R"] == R and c["method"] == ch and c["budget_factor"] == t["budget"]
            ]
            if len(rows) == len(BASELINES):
                ok.append(all(c["hi"] < 0 and c["better_cells"] >= t["better_cells_min"] for c in rows))
        return any(ok) if ok else None

    def full(R):
        rows = [c for c in charged if c["R"] == R and c["baseline"] == "CMA-ES" and c["measured"]]
        return None if R not in sizes or not rows else any(c["hi"] < 0 for c in rows)

    out = {
        "amortised": [{"R": R, "met": amortised(R)} for R in t["amortised_R"]],
        "charged": [{"R": R, "met": full(R)} for R in t["charged_R"]],
    }
    flags = [r["met"] for r in out["amortised"] + out["charged"]]
    out["met"] = None if any(f is None for f in flags) else all(flags)
    out["measured"] = sum(f is not None for f in flags)
    return out


def merge_payload(grads: list, boxes: list, params: dict) -> dict:
    """The artifact's payload (figure aside) from the gradient jobs' and black-box jobs' payloads."""
    from isaac_net.optimise import DEFAULT_CLASSES
    from isaac_net.optimise.fleet import class_counts

    sizes = sorted(g["R"] for g in grads)
    per = {}
    for g in sorted(grads, key=lambda g: g["R"]):
        per[g["R"]] = compare_size(g, {b["method"]: b for b in boxes if b["R"] == g["R"]}, params)
    rows = [r for p in per.values() for r in p["rows"]]
    comps = [c for p in per.values() for c in p["comparisons"]]
    charged = [c for p in per.values() for c in p["charged"]]
    targets = check_targets(params["targets"], comps, charged, sizes)
    summary = {
        "level": params["level"],
        "E": int(params["E"]),
        "T_eval": int(params["T_eval"]),
        "warmup_eval": int(params["warmup_eval"]),
        "sizes": len(sizes),
        "R_min": sizes[0],
        "R_max": sizes[-1],
        "budget_factor": params["budget_factor"],
        "iters": int(params["gradient"]["iters"]),
        "T": int(params["gradient"]["T"]),
        "n_boot": int(params["n_boot"]),
        "ci_pct": 95,
        "targets_met": targets["met"],
        "classes": len(DEFAULT_CLASSES),
    }
    classes = [
        {
            "name": c.name,
            "share": c.share,
            "size_lo_kB": c.size_bytes[0] / 1e3,
            "size_hi_kB": c.size_bytes[1] / 1e3,
            "distance_lo_m": c.distance_m[0],
            "distance_hi_m": c.distance_m[1],
            "weight": c.weight,
            "delivery_min": c.delivery_min,
            "robots": [class_counts([k.share for k in DEFAULT_CLASSES], R)[i] for R in sizes],
        }
        for i, c in enumerate(DEFAULT_CLASSES)
    ]
    return {
        "summary": summary,
        "baselines": list(BASELINES),
        # the methods that ran through the calibration's time at cover_calibration_R
        "cover_calibration": [BLACKBOX[m] for m in params["cover_calibration_methods"]],
        "classes": classes,
        "table": rows,
        "comparisons": comps,
        "charged": charged,
        "break_even": [e for p in per.values() for e in p["break_even"]],
        "sizes": [p["size"] for p in per.values()],
        "targets": targets,
        "traces": {str(R): p["traces"] for R, p in per.items()},
    }


def with_models(grad: dict, models: list) -> dict:
    """The gradient job's payload with the model jobs' results of its fleet size added."""
    grad = {**grad, "results": dict(grad["results"]),
            "model_calibration_cost": dict(grad["model_calibration_cost"])}
    for m in models:
        if m["R"] == grad["R"]:
            grad["results"][m["result"]["name"]] = m["result"]
            grad["model_calibration_cost"][m["result"]["name"]] = m["calibration_cost"]
    return grad


def merge(stage, params: dict, out: dict) -> None:
    models = [json.loads(open(p).read()) for p in out.get("models", [])]
    grads = [with_models(json.loads(open(p).read()), models) for p in out["gradient"]]
    boxes = [json.loads(open(p).read()) for p in out["blackbox"]]
    payload = merge_payload(grads, boxes, params)
    if "figure" in out:
        plot_fleet_opt(
            {int(R): t for R, t in payload["traces"].items()},
            {s["R"]: s["t_grad_s"] for s in payload["sizes"]},
            out["figure"],
            params["level"],
        )
        payload["figure"] = out["figure"].rsplit("/", 1)[-1]
    stage.write_json(out["json"], payload)


def main(stage, params: dict, out: dict, part: str | None = None) -> None:
    """Gradients through the calibrated models against CMA-ES, TPE, random search and the hybrid on
    the packet level, at several fleet sizes (``part``: gradient-<R>, blackbox-<R>-<method>, merge)."""
    kind, *rest = (part or "").split("-")
    if kind == "gradient" and len(rest) == 1 and rest[0].isdigit():
        gradient_part(stage, params, out, int(rest[0]))
    elif kind == "model" and len(rest) == 2 and rest[0].isdigit() and rest[1] == PROXY:
        proxy_part(stage, params, out, int(rest[0]))
    elif kind == "model" and len(rest) == 2 and rest[0].isdigit():
        model_part(stage, params, out, int(rest[0]), rest[1])
    elif kind == "blackbox" and len(rest) == 2 and rest[0].isdigit():
        blackbox_part(stage, params, out, int(rest[0]), rest[1])
    elif kind == "merge" and not rest:
        merge(stage, params, out)
    else:
        raise ValueError(
            "part: expected gradient-<R>, model-<R>-<mode>_<sends>, blackbox-<R>-<method> or merge, "
            f"got {part!r}"
        )


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
