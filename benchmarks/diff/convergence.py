"""Convergence of the relaxed models to the discrete levels as tau -> 0.

``part="table"``: the seed's table. Binary sends from fixed uniforms, the same in the
discrete level (``reference.discrete_rollout``) and in the relaxed model at every tau;
mean delay, mean AoI and delivery ratio for L1D/L1 and QAD/QA, their relative errors,
and the fitted log-log slope of the mean-delay error against tau.

``part="curves"``: mean delay against tau at larger size and several loads, with the
discrete value, and a figure (discrete value as a dashed line).
"""

import torch
from _common import draw_inputs, loglog_slope, parts, rel_err, run
from tqdm import tqdm

MODES = ("L1", "QA")


def trend(slope: float | None) -> str:
    """Words for a fitted log-log slope of error against tau."""
    if slope is None:
        return "shows no trend that a slope can be fitted to"
    if slope < 0.3:
        return "does not fall steadily as tau shrinks"
    if 0.7 <= slope <= 1.3:
        return "falls roughly linearly in tau"
    if slope > 1.3:
        return "falls faster than linearly in tau"
    return "falls slower than linearly in tau"


def direction(biases) -> str:
    """Words for the sign of the relaxed-minus-discrete values."""
    if all(b > 0 for b in biases):
        return "upward"
    if all(b < 0 for b in biases):
        return "downward"
    return "in both directions"


class Scenario:
    """One set of inputs, scored on the discrete level and on the relaxed model."""

    def __init__(self, E, R, T, p, sizes_bytes, snr_db, seed, device):
        self.T, self.device = T, device
        x = draw_inputs(E, R, T, sizes_bytes, seed, snr_db=snr_db, device=device)
        self.p = torch.full((E, R), float(p), dtype=torch.float64, device=device)
        self.B, self.snr_db, self.u = x["B"], x["snr_db"], x["u"]

    @staticmethod
    def _scalars(kpi) -> dict:
        return {"mean_delay": float(kpi["mean_delay"]), "mean_aoi": float(kpi["mean_aoi"]),
                "delivery_ratio": float(kpi["delivery_ratio"])}

    def discrete(self, mode: str) -> dict:
        from isaac_net.core.diff.reference import discrete_rollout

        with torch.no_grad():
            kpi = discrete_rollout(mode, self.T, self.p, self.B, snr_db=self.snr_db, u=self.u,
                                   dtype=torch.float64, device=self.device)
        return self._scalars(kpi)

    def relaxed(self, mode: str, tau: float) -> dict:
        from isaac_net.core.diff import DiffFluid, rollout

        E, R = self.p.shape
        net = DiffFluid(E, R, self.device, mode=mode, tau=float(tau), dtype=torch.float64)
        with torch.no_grad():
            kpi = rollout(net, self.T, self.p, self.B, snr_db=self.snr_db, sends="binary", u=self.u)
        return self._scalars(kpi)


def table(stage, params: dict, out: dict) -> None:
    c = params["table"]
    sc = Scenario(c["E"], c["R"], c["T"], c["p"], c["sizes_bytes"], c["snr_db"], params["seed"], stage.device)
    taus = [float(t) for t in c["taus"]]
    disc = {m: sc.discrete(m) for m in MODES}
    rows = []
    for tau in tqdm(taus, desc="convergence table", mininterval=2.0):
        row = {"tau": tau}
        for m in MODES:
            k = sc.relaxed(m, tau)
            row.update({f"{m}_{name}": v for name, v in k.items()})
            row.update({f"{m}_{name}_err_pct": 100.0 * rel_err(v, disc[m][name]) for name, v in k.items()})
            row[f"{m}_delay_bias"] = k["mean_delay"] - disc[m]["mean_delay"]
        rows.append(row)

    relaxed_rows = [r for r in rows if r["tau"] > 0]
    by_tau = {r["tau"]: r for r in rows}
    default_tau = float(params["default_tau"])
    if default_tau not in by_tau:
        raise ValueError(f"convergence.default_tau={default_tau} is not one of the table's taus {taus}")
    tau_min = min(r["tau"] for r in relaxed_rows)
    tau_max = max(r["tau"] for r in relaxed_rows)
    summary = {"default_tau": default_tau, "tau_min": tau_min, "tau_max": tau_max}
    for m in MODES:
        slope = loglog_slope([r["tau"] for r in relaxed_rows],
                             [r[f"{m}_mean_delay_err_pct"] for r in relaxed_rows])
        summary.update({
            f"{m}_discrete_delay": disc[m]["mean_delay"],
            f"{m}_discrete_aoi": disc[m]["mean_aoi"],
            f"{m}_discrete_delivery": disc[m]["delivery_ratio"],
            f"{m}_tau0_delay_err_pct": by_tau[0.0][f"{m}_mean_delay_err_pct"] if 0.0 in by_tau else None,
            f"{m}_delay_err_pct_at_default": by_tau[default_tau][f"{m}_mean_delay_err_pct"],
            f"{m}_delay_err_pct_at_min": by_tau[tau_min][f"{m}_mean_delay_err_pct"],
            f"{m}_delay_err_pct_at_max": by_tau[tau_max][f"{m}_mean_delay_err_pct"],
            f"{m}_aoi_err_pct_at_default": by_tau[default_tau][f"{m}_mean_aoi_err_pct"],
            f"{m}_delay_err_slope": slope,
            f"{m}_delay_err_trend": trend(slope),
            f"{m}_delay_biased_up": all(r[f"{m}_delay_bias"] > 0 for r in relaxed_rows),
            f"{m}_delay_bias_direction": direction([r[f"{m}_delay_bias"] for r in relaxed_rows]),
        })
    summary["max_delivery_err_pct"] = max(r[f"{m}_delivery_ratio_err_pct"] for r in rows for m in MODES)
    summary["delay_biased_up"] = all(summary[f"{m}_delay_biased_up"] for m in MODES)
    summary["max_delay_err_pct_at_default"] = max(summary[f"{m}_delay_err_pct_at_default"] for m in MODES)
    summary["max_delay_err_pct_at_min"] = max(summary[f"{m}_delay_err_pct_at_min"] for m in MODES)
    summary["min_delay_err_pct_at_max"] = min(summary[f"{m}_delay_err_pct_at_max"] for m in MODES)
    stage.write_json(out["json"], {"summary": summary, "table": rows})


def curves(stage, params: dict, out: dict) -> None:
    from _plots import convergence_curves

    c = params["curves"]
    taus = [float(t) for t in c["taus"]]
    rows = []
    num_runs = len(c["loads"]) * len(MODES) * (len(taus) + 1)
    bar = tqdm(total=num_runs, desc="convergence curves", mininterval=2.0)
    for i, load in enumerate(c["loads"]):
        sc = Scenario(c["E"], c["R"], c["T"], load, c["sizes_bytes"], c["snr_db"], params["seed"] + i,
                      stage.device)
        for m in MODES:
            disc = sc.discrete(m)
            bar.update()
            relaxed = []
            for tau in taus:
                relaxed.append(sc.relaxed(m, tau)["mean_delay"])
                bar.update()
            err = [100.0 * rel_err(v, disc["mean_delay"]) for v in relaxed]
            rows.append({"mode": m, "load": load, "discrete": disc["mean_delay"], "taus": taus,
                         "relaxed": relaxed, "err_pct": err, "slope": loglog_slope(taus, err)})
    bar.close()
    convergence_curves(rows, out["figure"])
    slopes = [r["slope"] for r in rows if r["slope"] is not None]
    summary = {
        "min_slope": min(slopes) if slopes else None,
        "max_slope": max(slopes) if slopes else None,
        "max_err_pct_at_min_tau": max(r["err_pct"][taus.index(min(taus))] for r in rows),
        "tau_min": min(taus),
        "delay_biased_up": all(v > r["discrete"] for r in rows for v in r["relaxed"]),
    }
    table_rows = [{"mode": r["mode"], "load": r["load"], "discrete": r["discrete"],
                   **{f"tau={t:g}": v for t, v in zip(taus, r["relaxed"], strict=True)}, "slope": r["slope"]}
                  for r in rows]
    stage.write_json(out["json"], {"summary": summary, "table": table_rows, "curves": rows,
                                   "figure": out["figure"].rsplit("/", 1)[-1]})


main = parts("Convergence of the relaxed KPIs to the discrete ones as tau -> 0.", table=table, curves=curves)


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
