"""Equivalence at tau = 0: L1D against L1 and QAD against QA, step by step.

Both sides get the same binary sends (``u < p`` from one set of fixed uniforms), sizes
and SNRs. Per step and robot, the delivered count, timeouts, overflow, AoI and queue
length must be equal (to ``tol``); the per-robot totals over the rollout of the KPI
registry's other quantities (delay sum, energy) must agree to ``tol`` relative.
Writes ``summary`` (worst differences, pass flag) and a ``table`` row per case and mode.
"""

import torch
from _common import cell_config, draw_inputs, run
from tqdm import tqdm

from isaac_net.core import kpi

#: Compared step by step (absolute); the registry's other totals over the rollout (relative).
COUNT_KEYS = ("delivered", "timeouts", "overflow", "aoi", "queued_msgs")
REL_KEYS = tuple(dict.fromkeys(k.total for k in kpi.KPIS if k.total not in COUNT_KEYS))
PAIRS = {"L1": "L1D vs L1", "QA": "QAD vs QA"}


def compare(mode: str, case: dict, E: int, R: int, T: int, seed: int, device: str) -> dict:
    from isaac_net.core import make_engine
    from isaac_net.core.diff import DiffFluid

    cfg = cell_config(case["cell"])
    x = draw_inputs(E, R, T, case["sizes_bytes"], seed, snr_db=case["snr_db"], device=device)
    net = DiffFluid(E, R, device, mode=mode, tau=0.0, cfg=cfg, dtype=torch.float64)
    eng = make_engine(mode, E, R, device, cfg=cfg, dtype=torch.float64)
    worst = dict.fromkeys(COUNT_KEYS, 0.0)
    sums = {side: {k: torch.zeros(E, R, dtype=torch.float64)
                   for k in (*REL_KEYS, "offered", "delivered", "timeouts", "overflow")}
            for side in ("relaxed", "discrete")}
    with torch.no_grad():
        for t in range(T):
            send = (x["u"][t] < case["p"]).to(torch.float64)
            a = net.step(send, x["B"], snr_db=x["snr_db"])
            b = eng.step(send, x["B"], snr_db=x["snr_db"])
            for k in COUNT_KEYS:
                worst[k] = max(worst[k], float((a[k] - b[k]).abs().max()))
            for side, kp in (("relaxed", a), ("discrete", b)):
                for k in sums[side]:
                    sums[side][k] += kp[k].detach().cpu()

    def max_rel(k):
        ra, rb = sums["relaxed"][k], sums["discrete"][k]
        denom = torch.where(rb.abs() > 0, rb.abs(), torch.ones_like(rb))
        return float(((ra - rb).abs() / denom).max())

    d = sums["discrete"]
    return {
        **{f"max_abs_{k}": v for k, v in worst.items()},
        **{f"max_rel_{k}": max_rel(k) for k in REL_KEYS},
        "offered": float(d["offered"].sum()),
        "delivered": float(d["delivered"].sum()),
        "timeouts": float(d["timeouts"].sum()),
        "overflow": float(d["overflow"].sum()),
        "buffer_msgs": cfg.buffer_msgs,
        "timeout_steps": cfg.timeout_steps,
    }


def main(stage, params: dict, out: dict) -> None:
    """Equivalence of the relaxed models at tau = 0 with the discrete levels."""
    E, R, T, tol = params["E"], params["R"], params["T"], params["tol"]
    jobs = [(name, mode) for name in params["cases"] for mode in PAIRS]
    rows = []
    for name, mode in tqdm(jobs, desc="equivalence", mininterval=2.0):
        case = params["cases"][name]
        r = compare(mode, case, E, R, T, params["seed"], stage.device)
        r["binds"] = r["timeouts"] > 0 and r["overflow"] > 0
        r["pass"] = (max(r[f"max_abs_{k}"] for k in COUNT_KEYS) <= tol
                     and max(r[f"max_rel_{k}"] for k in REL_KEYS) <= tol)
        rows.append({"case": name, "mode": mode, "pair": PAIRS[mode], "p": case["p"], **r})
    summary = {
        "tau": 0.0,
        "tol": tol,
        "all_pass": all(r["pass"] for r in rows),
        "max_abs_count_diff": max(max(r[f"max_abs_{k}"] for k in COUNT_KEYS) for r in rows),
        **{f"max_rel_{k}": max(r[f"max_rel_{k}"] for r in rows) for k in REL_KEYS},
    }
    stage.write_json(out["json"], {"summary": summary, "table": rows})


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
