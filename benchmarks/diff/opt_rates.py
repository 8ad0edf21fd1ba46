"""Optimisation demo: per-robot send probability and transmit power by gradient descent
through the relaxed model, against the best of N random candidates per env.

Cost per env (lower is better), the same on every model:

    cost = mean_delay + w_aoi * mean_aoi + w_energy * mean_energy_j
           + penalty * max(delivery_min - delivery_ratio, 0)

(the KPIs of the env's robots: delay and delivery totals over totals, AoI and energy
means; delay and AoI in control steps, energy in J per robot per step).

Gradient: Adam on unconstrained parameters (``p = lo + (hi - lo) sigmoid(theta)``, same
for tx power) of the relaxed model (``mode``, relaxed-Bernoulli sends with fresh
uniforms each iteration, ``tau`` annealed geometrically from ``tau_start`` to
``tau_end``). Random search: ``candidates`` uniform draws of the decisions per env, each
scored on the discrete level with the training sends; the best per env is kept.
Both results (and the starting point) are scored on the discrete level with held-out
sends (other uniforms, longer rollout) and on L2-legacy.
"""


import math
import time

import torch
from tqdm import tqdm

try:
    from _common import cell_config, generator, run
except ImportError:  # imported as benchmarks.diff.opt_rates (tests)
    from benchmarks.diff._common import cell_config, generator, run

KPIS = ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j")


def env_kpis(res: dict) -> dict:
    """Per-env KPIs ``[E]`` from a rollout's per-robot totals (totals over totals, as the batch means)."""
    delivered = res["delivered"].sum(-1)
    return {
        "mean_delay": res["delay_sum"].sum(-1) / delivered.clamp(min=1e-9),
        "delivery_ratio": delivered / res["offered"].sum(-1).clamp(min=1e-9),
        "mean_aoi": res["aoi"].mean(-1),
        "mean_energy_j": res["energy_j"].mean(-1),
    }


def env_cost(k: dict, c: dict) -> torch.Tensor:
    """The cost ``[E]`` of per-env KPIs ``k`` under the cost config ``c``."""
    w = c["weights"]
    shortfall = torch.clamp(float(c["delivery_min"]) - k["delivery_ratio"], min=0.0)
    return (w["mean_delay"] * k["mean_delay"] + w["mean_aoi"] * k["mean_aoi"]
            + w["mean_energy_j"] * k["mean_energy_j"] + float(c["penalty"]) * shortfall)


def cost_text(params: dict) -> str:
    """The cost of ``params`` in words (for the page)."""
    c = params["cost"]
    w = c["weights"]
    text = (f"mean_delay x {w['mean_delay']:g} + mean_aoi x {w['mean_aoi']:g} + mean_energy_j x "
            f"{w['mean_energy_j']:g} + {float(c['penalty']):g} x max({float(c['delivery_min']):g} - "
            f"delivery_ratio, 0)")
    if "move_weight" in params:
        text += f" + {float(params['move_weight']):g} per m moved (smoothed, mean over robots)"
    return text


def discrete_score(level, T, warmup, dec, u, *, cfg, seed, dtype, chunk=None) -> dict:
    """Per-env KPIs ``[E]`` (on the CPU, float64) of decisions ``dec`` (``p, B, pos, tx_dbm``)
    on a discrete level with send uniforms ``u``; envs in chunks of ``chunk``."""
    from isaac_net.core.diff.reference import discrete_rollout

    E = dec["p"].shape[0]
    chunk = E if chunk is None else int(chunk)
    parts = []
    for s in range(0, E, chunk):
        sl = slice(s, s + chunk)
        res = discrete_rollout(level, T, dec["p"][sl], dec["B"][sl], pos=dec["pos"][sl],
                               tx_dbm=dec["tx_dbm"][sl], warmup=warmup, u=u[:, sl], cfg=cfg, dtype=dtype,
                               seed=seed, device=dec["p"].device)
        parts.append(env_kpis(res))
    return {k: torch.cat([p[k] for p in parts]).cpu().double() for k in KPIS}


def anneal(tau_start: float, tau_end: float, i: int, n: int) -> float:
    """Geometric schedule from ``tau_start`` (i = 0) to ``tau_end`` (i = n - 1)."""
    if n <= 1:
        return tau_end
    return tau_start * (tau_end / tau_start) ** (i / (n - 1))


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


def bounded(theta: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.sigmoid(theta)


def unbounded(x: float, lo: float, hi: float) -> float:
    z = (x - lo) / (hi - lo)
    return math.log(z / (1.0 - z))


def gradient_opt(sc: dict, params: dict, decisions, score_every, progress=True) -> tuple[dict, list]:
    """Adam through the relaxed model. ``decisions(theta) -> dec``; returns the final
    decisions and a history of (iteration, relaxed cost, tau[, held-out discrete cost])."""
    from isaac_net.core.diff import DiffFluid, rollout

    dtype, dev = sc["B"].dtype, sc["B"].device
    E, R = sc["B"].shape
    cfg = cell_config(params.get("cell", {}))
    theta = decisions.init()
    opt = torch.optim.Adam(theta.values(), lr=float(params["lr"]))
    gen = generator(int(params["seed"]) + 1)
    n_it = int(params["iters"])
    hist = []
    it = range(n_it) if not progress else tqdm(range(n_it), desc="gradient", mininterval=2.0)
    for i in it:
        tau = anneal(float(params["tau_start"]), float(params["tau_end"]), i, n_it)
        net = DiffFluid(E, R, dev, mode=params["mode"], tau=tau, cfg=cfg, dtype=dtype)
        dec = decisions(theta)
        u = torch.rand(params["T"], E, R, generator=gen, dtype=dtype).to(dev)
        res = rollout(net, int(params["T"]), dec["p"], dec["B"], pos=dec["pos"], tx_dbm=dec["tx_dbm"],
                      warmup=int(params["warmup"]), sends=params["sends"], u=u, lam=float(params["lam"]))
        cost = env_cost(env_kpis(res), params["cost"]) + decisions.extra_cost(dec)
        opt.zero_grad()
        cost.sum().backward()
        opt.step()
        row = {"iter": i, "tau": tau, "relaxed_cost": float(cost.detach().mean())}
        if score_every and (i % score_every == 0 or i == n_it - 1):
            with torch.no_grad():
                d = {k: v.detach() for k, v in decisions(theta).items()}
            k = discrete_score(params["level"], int(params["T_eval"]), int(params["warmup_eval"]), d,
                               sc["u_test"], cfg=cfg, seed=int(params["seed"]), dtype=dtype)
            cost_d = env_cost(k, params["cost"]) + decisions.extra_cost(d).cpu()
            row["discrete_cost_heldout"] = float(cost_d.mean())
        hist.append(row)
    with torch.no_grad():
        return {k: v.detach() for k, v in decisions(theta).items()}, hist


def random_search(sc: dict, params: dict, sample, progress=True) -> dict:
    """Best of ``candidates`` random decisions per env, scored on the discrete level with the
    training sends. ``sample(n, gen) -> dec`` with envs repeated ``n`` times (candidate-major)."""
    dtype = sc["B"].dtype
    E, R = sc["B"].shape
    cfg = cell_config(params.get("cell", {}))
    n = int(params["candidates"])
    gen = generator(int(params["seed"]) + 2)
    per_chunk = max(1, int(params["rs_chunk_envs"]) // E)
    best_cost = torch.full((E,), math.inf, dtype=torch.float64)
    best = None
    every = sample(n, gen)  # all candidates up front: the draw does not depend on the chunking
    starts = list(range(0, n, per_chunk))
    it = starts if not progress else tqdm(starts, desc="random search", mininterval=2.0)
    for s in it:
        m = min(per_chunk, n - s)
        dec = {key: v[s * E:(s + m) * E] for key, v in every.items()}  # [m * E, R]
        u = sc["u_train"].repeat(1, m, 1)
        k = discrete_score(params["level"], int(params["T_eval"]), int(params["warmup_eval"]), dec, u,
                           cfg=cfg, seed=int(params["seed"]), dtype=dtype)
        c = (env_cost(k, params["cost"]) + sample.extra_cost(dec).cpu()).reshape(m, E)
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


def score_all(sc: dict, params: dict, sols: dict, extra_cost) -> list[dict]:
    """Rows of KPIs and cost of each solution on the discrete level (held-out sends) and L2-legacy."""
    dtype = sc["B"].dtype
    cfg = cell_config(params.get("cell", {}))
    rows = []
    for level, key in ((params["level"], "discrete"), (params["l2_level"], "l2")):
        for name, dec in sols.items():
            k = discrete_score(level, int(params["T_eval"]), int(params["warmup_eval"]), dec, sc["u_test"],
                               cfg=cfg, seed=int(params["seed"]) + 7, dtype=dtype,
                               chunk=params.get("score_chunk_envs"))
            cost = env_cost(k, params["cost"]) + extra_cost(dec).cpu()
            rows.append({"scored_on": f"{level} (held-out sends)", "solution": name,
                         "cost": float(cost.mean()), "cost_median": float(cost.median()),
                         **{kk: float(v.mean()) for kk, v in k.items()},
                         "_key": key, "_env_cost": cost})
    return rows


class RateDecisions:
    """Per-robot send probability and transmit power, bounded by sigmoids."""

    def __init__(self, sc: dict, params: dict):
        self.sc, self.b = sc, params["bounds"]
        self.params = params
        E, R = sc["B"].shape
        self.E, self.R = E, R

    def init(self) -> dict:
        b, dt, dev = self.b, self.sc["B"].dtype, self.sc["B"].device
        p0 = unbounded(float(self.params["p_init"]), *b["p"])
        t0 = unbounded(float(self.params["tx_init_dbm"]), *b["tx_dbm"])
        return {"p": torch.full((self.E, self.R), p0, dtype=dt, device=dev, requires_grad=True),
                "tx": torch.full((self.E, self.R), t0, dtype=dt, device=dev, requires_grad=True)}

    def __call__(self, theta: dict) -> dict:
        return {"p": bounded(theta["p"], *self.b["p"]), "tx_dbm": bounded(theta["tx"], *self.b["tx_dbm"]),
                "B": self.sc["B"], "pos": self.sc["pos"]}

    def extra_cost(self, dec: dict) -> torch.Tensor:
        return torch.zeros(dec["p"].shape[0], dtype=torch.float64, device=dec["p"].device)

    def sample(self, n: int, gen: torch.Generator) -> dict:
        b, dt, E, R = self.b, self.sc["B"].dtype, self.E, self.R
        dev = self.sc["B"].device

        def uni(lo, hi):  # drawn on the CPU: the same candidates on every device
            return (lo + (hi - lo) * torch.rand(n * E, R, generator=gen, dtype=dt)).to(dev)

        return {"p": uni(*b["p"]), "tx_dbm": uni(*b["tx_dbm"]), "B": self.sc["B"].repeat(n, 1),
                "pos": self.sc["pos"].repeat(n, 1, 1)}


class _Sampler:
    def __init__(self, decisions):
        self.d = decisions

    def __call__(self, n, gen):
        return self.d.sample(n, gen)

    def extra_cost(self, dec):
        return self.d.extra_cost(dec)


def compute(params: dict, decisions_cls=RateDecisions, progress=True, device: str = "cpu") -> dict:
    """The study: gradient, random search, scoring. Returns the artifact payload."""
    torch.manual_seed(int(params["seed"]))
    dtype = getattr(torch, params.get("dtype", "float32"))
    E, R = int(params["E"]), int(params["R"])
    sc = scenario(E, R, params, dtype, device)
    decisions = decisions_cls(sc, params)
    with torch.no_grad():
        start = {k: v.detach() for k, v in decisions(decisions.init()).items()}
    t0 = time.perf_counter()
    grad_sol, hist = gradient_opt(sc, params, decisions, int(params["score_every"]), progress)
    t1 = time.perf_counter()
    rs_sol = random_search(sc, params, _Sampler(decisions), progress)
    t2 = time.perf_counter()
    rows = score_all(sc, params, {"start": start, "gradient": grad_sol, "random search": rs_sol},
                     decisions.extra_cost)
    t3 = time.perf_counter()

    def get(key, sol):
        return next(r for r in rows if r["_key"] == key and r["solution"] == sol)

    n = int(params["candidates"])
    summary = {"cost": cost_text(params), "level": params["level"], "mode": params["mode"],
               "sends": params["sends"], "E": E, "R": R,
               "iters": int(params["iters"]), "candidates": n, "T": int(params["T"]),
               "T_eval": int(params["T_eval"]), "tau_start": float(params["tau_start"]),
               "tau_end": float(params["tau_end"])}
    for key, lvl in (("discrete", params["level"]), ("l2", params["l2_level"])):
        g, r, s = get(key, "gradient"), get(key, "random search"), get(key, "start")
        summary[f"{lvl}_cost_start"] = s["cost"]
        summary[f"{lvl}_cost_gradient"] = g["cost"]
        summary[f"{lvl}_cost_random_best_of_{n}"] = r["cost"]
        beats = (g["_env_cost"] < r["_env_cost"]).double()
        summary[f"{lvl}_gradient_beats_random_envs"] = float(beats.mean())
        if key == "l2":  # the discrete level's KPIs are in the table
            for kpi in KPIS:
                summary[f"{lvl}_{kpi}_start"] = s[kpi]
                summary[f"{lvl}_{kpi}_gradient"] = g[kpi]
    summary.update({"wall_gradient_s": t1 - t0, "wall_random_search_s": t2 - t1, "wall_scoring_s": t3 - t2})
    table = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    solutions = {name: {k: v.mean().item() for k, v in sol.items() if k in ("p", "tx_dbm")}
                 for name, sol in (("gradient", grad_sol), ("random search", rs_sol))}
    return {"summary": summary, "table": table, "history": hist, "solutions_mean": solutions,
            "config": params, "_grad_sol": grad_sol, "_rs_sol": rs_sol, "_start": start, "_sc": sc}


def figure(payload: dict, path: str, title: str) -> None:
    """Relaxed training cost and the held-out discrete cost against the iteration, with the
    random-search best and the start as lines."""
    try:
        from _plots import save
    except ImportError:
        from benchmarks.diff._plots import save
    import matplotlib.pyplot as plt

    hist, s = payload["history"], payload["summary"]
    lvl = s["level"]
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    ax.plot([h["iter"] for h in hist], [h["relaxed_cost"] for h in hist], lw=1,
            label=f"{s['mode']}D relaxed cost (training sends, tau annealed)")
    pts = [(h["iter"], h["discrete_cost_heldout"]) for h in hist if "discrete_cost_heldout" in h]
    if pts:
        ax.plot(*zip(*pts, strict=True), "o-", ms=3, label=f"{lvl}, held-out sends")
    ax.axhline(s[f"{lvl}_cost_random_best_of_{s['candidates']}"], color="k", ls="--", lw=1,
               label=f"random search, best of {s['candidates']} ({lvl}, held-out)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cost per env (mean over envs)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)


def write(stage, payload: dict, out: dict, title: str) -> None:
    fig_name = None
    if "figure" in out:
        figure(payload, out["figure"], title)
        fig_name = out["figure"].rsplit("/", 1)[-1]
    for k, v in payload["summary"].items():
        print(f"  {k}: {v}")
    clean = {k: v for k, v in payload.items() if not k.startswith("_")}
    stage.write_json(out["json"], {**clean, **({"figure": fig_name} if fig_name else {})})


def main(stage, params: dict, out: dict) -> None:
    """Per-robot send probability and transmit power: gradient vs random search."""
    write(stage, compute(params, RateDecisions, device=stage.device), out, "Send probability and tx power")


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
