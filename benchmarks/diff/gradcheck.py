"""Gradient correctness of the relaxed models.

``part="gradcheck"``: ``torch.autograd.gradcheck`` in float64 of each KPI (mean delay,
delivery ratio, mean AoI, mean energy) with respect to each input (send probability,
message size, transmit power, positions) at a tiny size, for each mode; for a failing
check, the worst element-wise gap between the analytic and the central-difference Jacobian.

``part="fd"``: at a realistic size, the autograd directional derivative of a KPI mix
along a random direction against central finite differences, for each input and a table
of steps (the error against the step, fitted log-log slope, figure), and the sign checks
d delay/dB > 0, d delay/dp > 0, d delay/dtx < 0, d energy/dtx > 0.

Inputs are in natural units: p, message size in kB, tx in dBm, positions in m.
"""

import torch
from _common import KPI_LABEL, KPIS, cell_config, draw_inputs, generator, loglog_slope, parts, run
from tqdm import tqdm

INPUTS = ("p", "B", "tx", "pos")
SIGNS = (  # (kpi, input, expected sign of the summed gradient)
    ("mean_delay", "B", 1),
    ("mean_delay", "p", 1),
    ("mean_delay", "tx", -1),
    ("mean_energy_j", "tx", 1),
)


def trend(slopes: list[float]) -> str:
    """Words for the fitted log-log slopes of the FD error against the step."""
    if not slopes:
        return "shows no trend that a slope can be fitted to"
    if all(1.5 <= s <= 2.5 for s in slopes):
        return "shrinks roughly quadratically with the step"
    if all(0.7 <= s <= 1.3 for s in slopes):
        return "shrinks roughly linearly with the step"
    if all(s > 0 for s in slopes):
        return "shrinks with the step"
    return "does not shrink steadily with the step"


def base_inputs(E: int, R: int, p: float, sizes_bytes, tx_dbm: float, seed: int) -> dict:
    """``p [E,R]``, ``B [E,R]`` kB, ``tx [E,R]`` dBm, ``pos [E,R,2]`` m."""
    x = draw_inputs(E, R, 1, sizes_bytes, seed, p=p, tx_dbm=tx_dbm)
    return {"p": x["p"], "B": x["B"] / 1000.0, "tx": x["tx"], "pos": x["pos"]}


def kpis(mode: str, tau: float, cfg, T: int, x: dict, deadline=None) -> dict:
    from isaac_net.core.diff import DiffFluid, rollout

    E, R = x["p"].shape
    net = DiffFluid(E, R, "cpu", mode=mode, tau=tau, cfg=cfg, dtype=torch.float64)
    return rollout(net, T, x["p"], 1000.0 * x["B"], pos=x["pos"], tx_dbm=x["tx"], deadline=deadline,
                   sends="mean_field")


def small(stage, params: dict, out: dict) -> None:
    c = params["small"]
    tau = float(params["tau"])
    cfg = cell_config(c["cell"])
    x0 = base_inputs(c["E"], c["R"], c["p"], c["sizes_bytes"], cfg.tx_dbm, params["seed"])
    deadline = torch.full((c["E"], c["R"]), float(c["deadline"]), dtype=torch.float64)
    jobs = [(m, k, i) for m in params["modes"] for k in KPIS for i in INPUTS]
    rows = []
    scale = {}
    for mode, kpi, name in tqdm(jobs, desc="gradcheck", mininterval=2.0):
        # Checked in units of the KPI's size at the base point where it exceeds one (throughput, in
        # B/s, is ~1e4): gradcheck's atol is absolute, and a central difference of a value v rounds
        # to about v * 1e-16 / eps. KPIs of size one or less are checked as they are.
        if (mode, kpi) not in scale:
            with torch.no_grad():
                scale[mode, kpi] = max(1.0, float(kpis(mode, tau, cfg, c["T"], x0, deadline)[kpi].abs()))

        def f(xi, mode=mode, kpi=kpi, name=name):
            return kpis(mode, tau, cfg, c["T"], {**x0, name: xi}, deadline)[kpi] / scale[mode, kpi]

        xi = x0[name].clone().requires_grad_(True)
        ok = torch.autograd.gradcheck(f, (xi,), eps=c["eps"], atol=c["atol"], rtol=c["rtol"],
                                      raise_exception=False)
        (analytic,) = torch.autograd.grad(f(xi), xi)
        gap = None
        if not ok:  # say by how much: the worst gap to the central-difference Jacobian
            numeric = torch.zeros_like(analytic).view(-1)
            with torch.no_grad():
                for j in range(xi.numel()):
                    d = torch.zeros_like(xi).view(-1)
                    d[j] = c["eps"]
                    numeric[j] = (f(x0[name] + d.view_as(xi)) - f(x0[name] - d.view_as(xi))) / (2 * c["eps"])
            gap = float((analytic - numeric.view_as(analytic)).abs().max())
        rows.append({"mode": mode, "kpi": kpi, "label": KPI_LABEL[kpi], "input": name, "pass": bool(ok),
                     "max_abs_gap": gap, "kpi_scale": scale[mode, kpi],
                     "max_grad": float(analytic.abs().max()) * scale[mode, kpi],
                     "nonzero": bool((analytic != 0).any())})
    summary = {
        "tau": tau,
        "all_pass": all(r["pass"] for r in rows),
        "num_checks": len(rows),
        "num_pass": sum(r["pass"] for r in rows),
        "max_abs_gap": max((r["max_abs_gap"] for r in rows if r["max_abs_gap"] is not None), default=None),
        "num_nonzero": sum(r["nonzero"] for r in rows),
        "num_slots": cfg.num_slots,
        "buffer_msgs": cfg.buffer_msgs,
        "timeout_steps": cfg.timeout_steps,
    }
    stage.write_json(out["json"], {"summary": summary, "table": rows})


def _fd_mode(mode: str, x0: dict, direction: dict, mix, steps: list, largest: list, tau: float, cfg,
             T: int, bar) -> tuple[list, list]:
    """One model's rows (autograd against central differences of the mixed KPI along ``direction``,
    per input and step) and its sign checks."""
    rows, signs = [], []
    x = {k: v.clone().requires_grad_(True) for k, v in x0.items()}
    k = kpis(mode, tau, cfg, T, x)
    grads_mix = torch.autograd.grad(mix(k), [x[n] for n in INPUTS], retain_graph=True)
    grad_of = {}
    for kpi in sorted({s[0] for s in SIGNS}):
        grad_of[kpi] = dict(zip(INPUTS, torch.autograd.grad(k[kpi], [x[n] for n in INPUTS],
                                                            retain_graph=True, allow_unused=True),
                                strict=True))
    del k
    bar.update()
    for kpi, name, sign in SIGNS:
        gsum = grad_of[kpi][name]
        value = float(gsum.sum()) if gsum is not None else 0.0
        signs.append({"mode": mode, "kpi": kpi, "input": name, "expected": "+" if sign > 0 else "-",
                      "grad_sum": value, "pass": value * sign > 0})
    for name, gr in zip(INPUTS, grads_mix, strict=True):
        ad = float((gr * direction[name]).sum())
        fds, errs = [], []
        with torch.no_grad():
            for h in steps:
                up = mix(kpis(mode, tau, cfg, T, {**x0, name: x0[name] + h * direction[name]}))
                dn = mix(kpis(mode, tau, cfg, T, {**x0, name: x0[name] - h * direction[name]}))
                fds.append(float((up - dn) / (2 * h)))
                errs.append(abs(fds[-1] - ad) / abs(ad) if ad != 0 else None)
                bar.update()
        finite = [e for e in errs if e is not None]
        rows.append({"mode": mode, "input": name, "autograd": ad, "fd": fds, "rel_err": errs,
                     "best_rel_err": min(finite) if finite else None,
                     "slope": loglog_slope(steps, [e or 0.0 for e in errs]),
                     "slope_large": loglog_slope([steps[j] for j in largest],
                                                 [errs[j] or 0.0 for j in largest])})
    return rows, signs


def fd(stage, params: dict, out: dict) -> None:
    from _plots import fd_error

    c = params["fd"]
    tau = float(params["tau"])
    cfg = cell_config(c["cell"])
    steps = [float(h) for h in c["steps"]]
    weights = c["weights"]
    x0 = base_inputs(c["E"], c["R"], c["p"], c["sizes_bytes"], cfg.tx_dbm, params["seed"])
    g = generator(params["seed"] + 1)
    # A Rademacher direction per input: each element moves by +-h in the input's unit.
    direction = {k: torch.randint(0, 2, v.shape, generator=g).to(torch.float64) * 2 - 1
                 for k, v in x0.items()}

    def mix(k: dict):
        return sum(w * k[name] for name, w in weights.items())

    largest = sorted(range(len(steps)), key=lambda j: -steps[j])[:2]  # indices of the two largest steps
    rows, signs = [], []
    bar = tqdm(total=len(params["modes"]) * (1 + len(INPUTS) * len(steps)), desc="finite differences",
               mininterval=2.0)
    for mode in params["modes"]:
        mode_rows, mode_signs = _fd_mode(mode, x0, direction, mix, steps, largest, tau, cfg, c["T"], bar)
        rows += mode_rows
        signs += mode_signs
    bar.close()
    fd_error(rows, steps, out["figure"])
    best = [r["best_rel_err"] for r in rows]
    slopes = [r["slope"] for r in rows if r["slope"] is not None]
    # Truncation error dominates at the large steps, rounding error at the small ones.
    slopes_large = [r["slope_large"] for r in rows if r["slope_large"] is not None]
    summary = {
        "tau": tau,
        "tol": c["tol"],
        "max_best_rel_err": None if None in best else max(best),
        "all_match": None not in best and max(best) <= c["tol"],
        "min_slope": min(slopes) if slopes else None,
        "max_slope": max(slopes) if slopes else None,
        "min_slope_large": min(slopes_large) if slopes_large else None,
        "max_slope_large": max(slopes_large) if slopes_large else None,
        "trend": trend(slopes_large),
        "step_max": max(steps),
        "step_min": min(steps),
        "max_err_at_step_max": max((r["rel_err"][steps.index(max(steps))] or 0.0) for r in rows),
        "max_err_at_step_min": max((r["rel_err"][steps.index(min(steps))] or 0.0) for r in rows),
        "signs_pass": all(s["pass"] for s in signs),
        "num_slots": cfg.num_slots,
    }
    table = [{"mode": r["mode"], "input": r["input"], "autograd": r["autograd"],
              **{f"err@{h:g}": e for h, e in zip(steps, r["rel_err"], strict=True)}, "slope": r["slope"]}
             for r in rows]
    stage.write_json(out["json"], {"summary": summary, "table": table, "rows": rows, "signs": signs,
                                   "steps": steps, "figure": out["figure"].rsplit("/", 1)[-1]})


main = parts("Gradient checks of the relaxed models.", gradcheck=small, fd=fd)


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
