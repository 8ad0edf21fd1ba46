"""The optimisation study that ``opt_rates`` (send probability and power) and ``placement``
(robot positions) share: the decisions are a class of the stage script (``init``, ``__call__``,
``extra_cost``, ``sample``, and ``uniform`` where a uniform policy exists); this module runs the
gradient runs through each model, random search and the uniform policy, scores every solution
on the discrete level with held-out sends and writes the artifact with its figure.

Cost per env (lower is better), the same on every model:

    cost = mean_delay + w_aoi * mean_aoi + w_energy * mean_energy_j
           + penalty * max(delivery_min - delivery_ratio, 0) + extra_cost(decisions)
"""


import math
import time

import torch
from tqdm import tqdm

# The cost, scoring, schedule and bounds are the library's (isaac_net.optimise), one copy; the
# stage scripts and tests take anneal, bounded and unbounded from here.
from isaac_net.optimise.cost import discrete_score, env_cost, env_kpis, paired_diff
from isaac_net.optimise.gradient import anneal, bounded, fluid_cost, gradient_descent, unbounded  # noqa: F401

try:
    from _common import cell_config, generator
    from _plots import optimisation
except ImportError:  # imported as benchmarks.diff._optimise (tests)
    from benchmarks.diff._common import cell_config, generator
    from benchmarks.diff._plots import optimisation


def scenario(E: int, R: int, params: dict, dtype, device="cpu") -> dict:
    """Fixed parts of the problem: positions, message sizes, training and held-out uniforms
    (drawn on the CPU, then moved to ``device``)."""
    g = generator(int(params["seed"]))
    lo, hi = params.get("area_m", [40.0, 140.0])
    sizes = torch.tensor([float(s) for s in params["sizes_bytes"]], dtype=dtype)
    sc = {
        "pos": lo + (hi - lo) * torch.rand(E, R, 2, generator=g, dtype=dtype),
        "B": sizes[torch.randint(len(sizes), (E, R), generator=g)],
        "u_train": torch.rand(params["T_eval"], E, R, generator=g, dtype=dtype),
        "u_test": torch.rand(params["T_eval"], E, R, generator=generator(int(params["seed"]) + 10_000),
                             dtype=dtype),
    }
    return {k: v.to(device) for k, v in sc.items()}


def model_name(spec: dict) -> str:
    """The solution's name for a gradient run through ``spec`` (a model of ``params["models"]``
    or ``{"proxy": True}``)."""
    if spec.get("proxy"):
        return "gradient, neural proxy"
    sends = spec["sends"].replace("_", "-")
    return f"gradient, {spec['mode']}D {sends}" + (", calibrated" if spec["calibrated"] else "")


def _proxy_cost(proxy, dec: dict, cfg, cost: dict) -> torch.Tensor:
    """Cost ``[E]`` from the proxy's per-robot KPIs: expected counts per robot (sends p, delivered
    p delivery) combined as the env KPIs are (totals over totals, means)."""
    from isaac_net.core import kpi, radio

    k = proxy.predict(dec["p"], dec["B"], radio.snr_db(dec["pos"], dec["tx_dbm"], cfg))
    totals = kpi.expected_totals(dec["p"], k, kpi.PROXY_KPIS)
    return env_cost(kpi.batch_kpis(totals, dim=-1, kpis=kpi.PROXY_KPIS), cost)


def gradient_opt(sc: dict, params: dict, decisions, spec: dict, *, cfg, level_cfg, proxy=None,
                 tau_min: float = 0.0, progress=True) -> tuple[dict, list]:
    """Adam through the model ``spec`` (its config ``cfg``, calibrated or not) or, with
    ``spec["proxy"]``, through ``proxy``, ``tau`` annealed from ``tau_start`` to ``tau_end`` but
    not below ``tau_min`` (a calibrated model's fitted temperature: colder, it leaves the operating
    point it was fitted at). ``decisions(theta) -> dec``; returns the final decisions and a
    history of (iteration, model cost, tau[, held-out cost on ``level``])."""
    dtype = sc["B"].dtype
    gen = generator(int(params["seed"]) + 1)
    n_it, name = int(params["iters"]), model_name(spec)
    if spec.get("proxy"):
        def model_cost(dec, tau):
            return _proxy_cost(proxy, dec, cfg, params["cost"])
    else:
        model_cost = fluid_cost(lambda res: env_cost(env_kpis(res), params["cost"]), mode=spec["mode"],
                                cfg=cfg, sends=spec["sends"], T=int(params["T"]),
                                warmup=int(params["warmup"]), lam=float(params["lam"]), generator=gen,
                                compile=spec["mode"] in params.get("compile", []))

    def score(d):
        k = discrete_score(params["level"], int(params["T_eval"]), int(params["warmup_eval"]), d,
                           sc["u_test"], cfg=level_cfg, seed=int(params["seed"]) + 7, dtype=dtype)
        return env_cost(k, params["cost"]) + decisions.extra_cost(d).cpu()

    return gradient_descent(decisions, model_cost, iters=n_it, lr=float(params["lr"]),
                            tau_start=float(params["tau_start"]), tau_end=float(params["tau_end"]),
                            tau_min=tau_min, score=score, score_every=int(params["score_every"]),
                            progress=None if not progress else lambda r: tqdm(r, desc=name, mininterval=2.0))


def random_search(sc: dict, params: dict, decisions, progress=True, *, level_cfg=None) -> dict:
    """Best of ``candidates`` random decisions per env, scored on the discrete level with the
    training sends. ``decisions.sample(n, gen) -> dec`` with envs repeated ``n`` times
    (candidate-major), plus ``decisions.extra_cost(dec)``."""
    dtype = sc["B"].dtype
    E, R = sc["B"].shape
    cfg = level_cfg
    n = int(params["candidates"])
    gen = generator(int(params["seed"]) + 2)
    per_chunk = max(1, int(params["rs_chunk_envs"]) // E)
    best_cost = torch.full((E,), math.inf, dtype=torch.float64)
    best = None
    every = decisions.sample(n, gen)  # all candidates up front: the draw does not depend on the chunking
    starts = list(range(0, n, per_chunk))
    it = starts if not progress else tqdm(starts, desc="random search", mininterval=2.0)
    for s in it:
        m = min(per_chunk, n - s)
        dec = {key: v[s * E:(s + m) * E] for key, v in every.items()}  # [m * E, R]
        u = sc["u_train"].repeat(1, m, 1)
        k = discrete_score(params["level"], int(params["T_eval"]), int(params["warmup_eval"]), dec, u,
                           cfg=cfg, seed=int(params["seed"]), dtype=dtype)
        c = (env_cost(k, params["cost"]) + decisions.extra_cost(dec).cpu()).reshape(m, E)
        c = torch.where(torch.isfinite(c), c, torch.full_like(c, math.inf))
        cmin, arg = c.min(0)
        better = cmin < best_cost
        best_cost = torch.where(better, cmin, best_cost)
        pick = {key: v.reshape(m, E, *v.shape[1:])[arg.to(v.device), torch.arange(E, device=v.device)]
                for key, v in dec.items()}
        if best is None:
            best = pick
        else:
            best = {key: torch.where(better.to(v.device).view(E, *([1] * (v.ndim - 1))), pick[key], v)
                    for key, v in best.items()}
    return best


def uniform_search(sc: dict, params: dict, decisions, progress=True, *, level_cfg=None
                   ) -> tuple[dict, dict]:
    """The best uniform policy: every ``(p, tx_dbm)`` of ``params["uniform"]`` for all robots of all
    envs, scored on ``level`` with the training sends; the one with the lowest mean cost (and it)."""
    dtype = sc["B"].dtype
    E = sc["B"].shape[0]
    grid = [(float(pp), float(tx)) for pp in params["uniform"]["p"] for tx in params["uniform"]["tx_dbm"]]
    per_chunk = max(1, int(params["rs_chunk_envs"]) // E)
    costs = []
    starts = list(range(0, len(grid), per_chunk))
    for s0 in (starts if not progress else tqdm(starts, desc="uniform policies", mininterval=2.0)):
        chunk = grid[s0:s0 + per_chunk]
        dec = decisions.uniform(chunk)
        k = discrete_score(params["level"], int(params["T_eval"]), int(params["warmup_eval"]), dec,
                           sc["u_train"].repeat(1, len(chunk), 1), cfg=level_cfg,
                           seed=int(params["seed"]), dtype=dtype)
        costs += env_cost(k, params["cost"]).reshape(len(chunk), E).mean(-1).tolist()
    best = min(range(len(grid)), key=lambda i: costs[i])
    return decisions.uniform([grid[best]]), {"p": grid[best][0], "tx_dbm": grid[best][1],
                                             "train_cost": costs[best], "policies": len(grid)}


def score_all(sc: dict, params: dict, sols: dict, extra_cost, *, level_cfg=None) -> list[dict]:
    """Rows of KPIs and per-env cost of each solution on ``level`` with the held-out sends."""
    dtype = sc["B"].dtype
    rows = []
    for name, dec in sols.items():
        k = discrete_score(params["level"], int(params["T_eval"]), int(params["warmup_eval"]), dec,
                           sc["u_test"], cfg=level_cfg, seed=int(params["seed"]) + 7, dtype=dtype,
                           chunk=params.get("score_chunk_envs"))
        cost = env_cost(k, params["cost"]) + extra_cost(dec).cpu()
        rows.append({"solution": name, "cost": float(cost.mean()), "cost_median": float(cost.median()),
                     **{kk: float(v.mean()) for kk, v in k.items()}, "_env_cost": cost})
    return rows


def load_proxy(path, params: dict, cfg):
    """The neural proxy of the nn_proxy stage, checked against the study's R and cell."""
    from isaac_net.core.diff import proxy as px

    return px.Proxy.load(path, R=int(params["R"]), cfg=cfg)


def compute(params: dict, decisions_cls, progress=True, device: str = "cpu",
            calibration=None, proxy_path: str | None = None) -> dict:
    """The study: a gradient run through each model, random search, the uniform policy, scoring on
    ``level``. ``decisions_cls(sc, params)`` builds the stage's decisions (``RateDecisions`` of
    opt_rates, ``PlacementDecisions`` of placement); ``calibration``: the calibration file, or the
    fit files (one per model and fitted size) that serve ``R`` (``Calibration.load``). Returns the
    artifact payload."""
    from isaac_net.core.diff.calibrate import Calibration

    torch.manual_seed(int(params["seed"]))
    dtype = getattr(torch, params.get("dtype", "float32"))
    E, R = int(params["E"]), int(params["R"])
    cfg = cell_config(params.get("cell", {}))
    sc = scenario(E, R, params, dtype, device)
    decisions = decisions_cls(sc, params)
    with torch.no_grad():
        start = {k: v.detach() for k, v in decisions(decisions.init()).items()}
    specs = [dict(m) for m in params["models"]] + ([{"proxy": True}] if params.get("proxy") else [])
    proxy = load_proxy(proxy_path, params, cfg) if params.get("proxy") else None
    area = params.get("area_m", [40.0, 140.0])
    sols, hist, wall = {"start": start}, {}, {}
    for spec in specs:
        mcfg, tau_min = cfg, 0.0
        if spec.get("calibrated"):
            cal = Calibration.load(calibration, mode=spec["mode"], sends=spec["sends"]).at(R)
            mcfg, tau_min = cal.apply(cfg, R=R, area_m=area), cal.tau
        t0 = time.perf_counter()
        name = model_name(spec)
        sols[name], hist[name] = gradient_opt(sc, params, decisions, spec, cfg=mcfg, level_cfg=cfg,
                                              proxy=proxy, tau_min=tau_min, progress=progress)
        wall[name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sols["random search"] = random_search(sc, params, decisions, progress, level_cfg=cfg)
    wall["random search"] = time.perf_counter() - t0
    uniform = None
    if "uniform" in params:
        t0 = time.perf_counter()
        sols["uniform policy"], uniform = uniform_search(sc, params, decisions, progress, level_cfg=cfg)
        wall["uniform policy"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    rows = score_all(sc, params, sols, decisions.extra_cost, level_cfg=cfg)
    wall["scoring"] = time.perf_counter() - t0
    by = {r["solution"]: r for r in rows}
    n_boot, seed = int(params.get("n_boot", 2000)), int(params["seed"])
    comparisons = compare_to_baselines(sols, by, n_boot, seed)
    targets = check_targets(params.get("targets"), comparisons)
    summary = {"level": params["level"], "E": E, "R": R, "iters": int(params["iters"]),
               "candidates": int(params["candidates"]), "T": int(params["T"]),
               "T_eval": int(params["T_eval"]),
               "tau_start": float(params["tau_start"]), "tau_end": float(params["tau_end"]),
               "models": len(specs), "ci_pct": 95}
    table = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    solutions = {name: {k: v.mean().item() for k, v in sol.items() if k in ("p", "tx_dbm")}
                 for name, sol in sols.items()}
    return {"summary": summary, "table": table, "comparisons": comparisons, "targets": targets,
            "history": hist,
            "uniform_policy": uniform, "solutions_mean": solutions, "wall_s": wall, "config": params,
            "env_costs": {r["solution"]: r["_env_cost"].tolist() for r in rows},
            "_sols": sols, "_sc": sc}


def compare_to_baselines(sols: dict, by: dict, n_boot: int, seed: int) -> list:
    """One row per gradient solution: its cost and delivery, and against each baseline scored
    (start, random search, uniform policy) the paired difference of the per-env costs with its
    bootstrap interval, the share of envs it is better on and the verdict."""
    comparisons = []
    for name in (n for n in sols if n.startswith("gradient")):
        g = by[name]["_env_cost"]
        row = {"solution": name, "cost": by[name]["cost"], "delivery_ratio": by[name]["delivery_ratio"]}
        for base in ("start", "random search", "uniform policy"):
            if base not in by:
                continue
            mean, lo, hi = paired_diff(g, by[base]["_env_cost"], n_boot, seed)
            key = base.replace(" ", "_")
            row[f"vs_{key}_diff"], row[f"vs_{key}_lo"], row[f"vs_{key}_hi"] = mean, lo, hi
            row[f"vs_{key}_better_envs"] = float((g < by[base]["_env_cost"]).double().mean())
            # better: the whole interval below 0; worse: above; otherwise no worse (within the CI)
            row[f"vs_{key}"] = "better" if hi < 0 else ("worse" if lo > 0 else "tie")
        comparisons.append(row)
    return comparisons


def check_targets(t: dict | None, comparisons: list) -> dict | None:
    """The study's targets (``params["targets"]``) checked on ``compare_to_baselines``'s rows: None
    without targets; else whether the named solution was run and which targets it met."""
    targets = None
    if t:
        row = next((r for r in comparisons if r["solution"] == t["solution"]), None)
        targets = {"solution": t["solution"], "available": row is not None}
        if row is not None:
            checks = {}
            if "start_envs_min" in t:
                checks["start_envs"] = row["vs_start_better_envs"] >= t["start_envs_min"]
            if "random_envs_min" in t:
                checks["random_envs"] = row["vs_random_search_better_envs"] >= t["random_envs_min"]
            if t.get("beat_random_search"):
                checks["beat_random_search"] = row["vs_random_search_diff"] < 0
            if t.get("uniform_no_worse") and "vs_uniform_policy" in row:
                checks["uniform_no_worse"] = row["vs_uniform_policy"] != "worse"
            targets.update({f"{k}_met": v for k, v in checks.items()}, met=all(checks.values()))
    return targets


def write(stage, payload: dict, out: dict, title: str) -> None:
    fig_name = None
    if "figure" in out:
        optimisation(payload, out["figure"], title)
        fig_name = out["figure"].rsplit("/", 1)[-1]
    clean = {k: v for k, v in payload.items() if not k.startswith("_")}
    stage.write_json(out["json"], {**clean, **({"figure": fig_name} if fig_name else {})})
