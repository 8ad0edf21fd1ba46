"""Neural proxy: collect per-robot KPIs from L2-legacy rollouts over ``proxy.RANGES``, fit
the MLP, report its held-out fit quality per KPI, and compare its per-robot gradients with
L2-legacy finite differences.

Data: ``train_cells + test_cells`` cells of R robots, each robot with its own send
probability, message size and SNR drawn from the ranges; one sample per robot (its inputs
plus the load context of its cell). Held out by cell: no robot of a test cell is trained on.

Gradients: on ``grad_cells`` fresh cells, robot 0's own input is moved by ``±h`` (the other
robots unchanged) with common random numbers (same engine seed, same send uniforms), and
its KPI's central difference is compared with the proxy's autograd derivative. Per-robot
KPIs of one rollout are noisy, so the comparison is of means over cells (mean ± standard
error, sign agreement where the FD mean is more than two standard errors from zero, ratio
with a paired bootstrap 95 % interval) plus the across-cell correlation. Steps: ``p ± h_p``
(a step function of binary sends averaged over cells, as in ``sensitivity``), message size
``× (1 ± h_rel)`` (derivative per kB), SNR ``± h_db``.
"""


import math
import time

import numpy as np
import torch
from tqdm import tqdm

try:
    from _common import cell_config, generator, ratio_ci, run
    from _plots import proxy_fit
except ImportError:  # imported as benchmarks.diff.nn_proxy (tests)
    from benchmarks.diff._common import cell_config, generator, ratio_ci, run
    from benchmarks.diff._plots import proxy_fit

from isaac_net.core.diff import proxy as px
from isaac_net.core.kpi import KPIS as KPI_REGISTRY

INPUT_UNIT = {"p": "p", "msg_bytes": "kB", "snr_db": "SNR dB"}
KPI_LABEL = {k.key: k.label for k in KPI_REGISTRY}


def gradient_check(model: px.Proxy, params: dict, cfg, dtype, progress=True, device="cpu") -> list[dict]:
    """Proxy vs L2-legacy central FD of robot 0's KPIs in robot 0's own inputs, per cell."""
    from isaac_net.core.diff.reference import discrete_rollout

    G, R, T, warmup = (int(params[k]) for k in ("grad_cells", "R", "T", "warmup"))
    ranges = params.get("ranges") or px.RANGES
    gen = generator(int(params["seed"]) + 20_000)
    inp = px.sample_inputs(G, R, gen, ranges, dtype=dtype)
    u = torch.rand(T, G, R, generator=gen, dtype=dtype)
    h = params["fd_steps"]
    only0 = torch.zeros(G, R, dtype=dtype)
    only0[:, 0] = 1.0
    steps = {"p": only0 * float(h["p"]), "msg_bytes": only0 * float(h["msg_rel"]) * inp["msg_bytes"],
             "snr_db": only0 * float(h["snr_db"])}

    def robot0(shift_name, sgn):
        x = dict(inp)
        if shift_name is not None:
            x[shift_name] = x[shift_name] + sgn * steps[shift_name]
        x = {k: v.to(device) for k, v in x.items()}
        res = discrete_rollout(params["level"], T, x["p"], x["msg_bytes"], snr_db=x["snr_db"], warmup=warmup,
                               u=u.to(device), cfg=cfg, dtype=dtype, seed=int(params["seed"]) + 20_000,
                               device=device)
        return {k: res[k][:, 0].cpu().double() for k in px.TARGETS}

    jobs = [(n, s) for n in px.INPUTS[:3] for s in (1.0, -1.0)]
    it = jobs if not progress else tqdm(jobs, desc=f"{params['level']} FD", mininterval=2.0)
    vals = {job: robot0(*job) for job in it}
    # Proxy derivatives at the base point, per cell, for robot 0.
    leaves = {k: v.clone().requires_grad_(True) for k, v in inp.items()}
    pred = model.predict(leaves["p"].to(model.x_mean.dtype), leaves["msg_bytes"].to(model.x_mean.dtype),
                         leaves["snr_db"].to(model.x_mean.dtype))
    rng = np.random.default_rng(int(params["seed"]))
    rows = []
    for ki, kpi in enumerate(px.TARGETS):
        grads = torch.autograd.grad(pred[kpi][:, 0].sum(), [leaves[n] for n in px.INPUTS[:3]],
                                    retain_graph=ki < len(px.TARGETS) - 1)
        for name, g in zip(px.INPUTS[:3], grads, strict=True):
            scale = 1000.0 if name == "msg_bytes" else 1.0  # per kB
            g0 = (g[:, 0].double() * scale).numpy()
            fd = ((vals[(name, 1.0)][kpi] - vals[(name, -1.0)][kpi]) / (2.0 * steps[name][:, 0].double())
                  * scale).numpy()
            ok = np.isfinite(fd) & np.isfinite(g0)
            fd, g0 = fd[ok], g0[ok]
            n = len(fd)
            fd_mean = float(fd.mean())
            fd_se = float(fd.std(ddof=1) / math.sqrt(n))
            significant = abs(fd_mean) > 2.0 * fd_se
            ratio, lo, hi = ratio_ci(g0, fd, int(params["n_boot"]), rng)
            corr = float(np.corrcoef(g0, fd)[0, 1]) if n > 2 and g0.std() > 0 and fd.std() > 0 else None
            agree = bool(np.sign(g0.mean()) == np.sign(fd_mean)) if significant else None
            rows.append({"derivative": f"d {KPI_LABEL[kpi]} / d {INPUT_UNIT[name]}", "cells": n,
                         "proxy": float(g0.mean()), "fd_mean": fd_mean, "fd_se": fd_se,
                         "fd_significant": significant, "sign_agree": agree, "ratio": ratio,
                         "ratio_lo": lo, "ratio_hi": hi,
                         "ci": "unbounded" if math.isinf(lo) else "none" if math.isnan(lo) else "bounded",
                         "corr_over_cells": corr,
                         "_kpi": kpi, "_input": name, "_agree": agree, "_ratio": ratio, "_lo": lo, "_hi": hi})
    return rows


def compute(params: dict, model_path: str | None = None, progress: bool = True, device: str = "cpu") -> dict:
    """The study: collect on ``device``, fit on the CPU, gradient check on ``device``."""
    dtype = getattr(torch, params.get("dtype", "float32"))
    cfg = cell_config(params.get("cell", {}))
    torch.manual_seed(int(params["seed"]))
    n_train, n_test, R = int(params["train_cells"]), int(params["test_cells"]), int(params["R"])
    bar = (lambda xs: tqdm(xs, desc="collect", mininterval=2.0)) if progress else None
    t0 = time.perf_counter()
    data = px.collect(params["level"], n_train + n_test, R, int(params["T"]), warmup=int(params["warmup"]),
                      seed=int(params["seed"]), ranges=params.get("ranges"), cfg=cfg, dtype=dtype,
                      batch_cells=int(params["batch_cells"]), progress=bar, device=device)
    t1 = time.perf_counter()
    train = data["cell"] < n_train
    fbar = (lambda xs: tqdm(xs, desc="fit", mininterval=2.0)) if progress else None
    model, fit_info = px.fit(data["x"][train], data["y"][train], hidden=params["hidden"],
                             epochs=int(params["epochs"]), lr=float(params["lr"]),
                             batch_size=int(params["batch_size"]), seed=int(params["seed"]),
                             ranges=params.get("ranges") or data["meta"]["ranges"], fitted_on=data["meta"],
                             progress=fbar)
    t2 = time.perf_counter()
    held = px.evaluate(model, data["x"][~train], data["y"][~train])
    seen = px.evaluate(model, data["x"][train], data["y"][train])
    reload_diff = None
    if model_path is not None:
        model.save(model_path)
        again = px.Proxy.load(model_path)
        with torch.no_grad():
            reload_diff = float((again(data["x"][~train]) - model(data["x"][~train])).abs().max())
    grows = gradient_check(model, params, cfg, dtype, progress, device)
    t3 = time.perf_counter()
    summary = {"level": params["level"], "train_cells": n_train, "test_cells": n_test, "robots": R,
               "T": int(params["T"]), "warmup": int(params["warmup"]),
               "samples_train": int(train.sum()), "samples_test": int((~train).sum()),
               "hidden": "x".join(str(h) for h in params["hidden"]), "epochs": int(params["epochs"]),
               "final_train_loss": fit_info["loss"]}
    for k in px.TARGETS:
        summary[f"heldout_r2_{k}"] = held[k]["r2"]
        summary[f"heldout_mean_rel_err_{k}"] = held[k]["mean_rel_err"]
        summary[f"train_r2_{k}"] = seen[k]["r2"]
    sig = [r for r in grows if r["_agree"] is not None]
    summary["grad_cells"] = int(params["grad_cells"])
    summary["grad_fd_significant"] = len(sig)
    summary["grad_sign_agree"] = (sum(r["_agree"] for r in sig) / len(sig)) if sig else None
    covers = [r["_lo"] <= 1.0 <= r["_hi"] for r in sig]
    summary["grad_ratio_ci_covers_1"] = (sum(covers) / len(sig)) if sig else None
    summary["ratio_ci_pct"] = 95
    summary["fd_step_p"] = float(params["fd_steps"]["p"])
    summary["fd_step_msg_rel"] = float(params["fd_steps"]["msg_rel"])
    summary["fd_step_snr_db"] = float(params["fd_steps"]["snr_db"])
    if reload_diff is not None:
        summary["reload_max_abs_diff"] = reload_diff
    summary.update({"wall_collect_s": t1 - t0, "wall_fit_s": t2 - t1, "wall_grad_check_s": t3 - t2})
    # Held-out predictions for the figure (a sample of at most 2000 robots).
    te = torch.nonzero(~train).squeeze(-1)[:2000]
    with torch.no_grad():
        pred = model(data["x"][te]).double()
    scatter = {k: {"true": data["y"][te, i].double().tolist(), "pred": pred[:, i].tolist()}
               for i, k in enumerate(px.TARGETS)}
    table = [{k: v for k, v in r.items() if not k.startswith("_")} for r in grows]
    return {"summary": summary, "table": table, "fit": {"heldout": held, "train": seen}, "config": params,
            "ranges": params.get("ranges") or {k: list(v) for k, v in px.RANGES.items()},
            "_scatter": scatter}


def main(stage, params: dict, out: dict) -> None:
    """Neural proxy: fit to L2-legacy per-robot KPIs, held-out quality, gradients vs FD."""
    payload = compute(params, out.get("model"), device=stage.device)
    fig_name = None
    if "figure" in out:
        proxy_fit(payload, out["figure"], px.TARGETS, KPI_LABEL)
        fig_name = out["figure"].rsplit("/", 1)[-1]
    for k, v in payload["summary"].items():
        print(f"  {k}: {v}")
    clean = {k: v for k, v in payload.items() if not k.startswith("_")}
    if "model" in out:
        clean["model"] = out["model"].rsplit("/", 1)[-1]
    stage.write_json(out["json"], {**clean, **({"figure": fig_name} if fig_name else {})})


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
