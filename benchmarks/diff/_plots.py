"""Figures of the stages. Agg backend, no timestamps or software version in the metadata,
so that a rerun with the same numbers writes the same bytes."""

from __future__ import annotations

import functools
import math

import numpy as np

from isaac_net.core import kpi

_METADATA = {"Software": None, "Date": None}


@functools.cache
def _pyplot():
    """matplotlib's pyplot on the Agg backend, imported at the first figure: every job of the stages
    imports this module and most draw nothing (matplotlib takes some 0.6 s to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(i: int) -> str:
    """The ``i``-th colour of matplotlib's default cycle (cyclic)."""
    colors = _pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return colors[i % len(colors)]


def save(fig, path: str) -> None:
    fig.savefig(path, dpi=110, metadata=_METADATA)
    _pyplot().close(fig)


def convergence_curves(curves: list[dict], path: str) -> None:
    """Mean delay of the relaxed model vs tau (log x), the discrete value as a dashed line.

    :input curves: rows with ``mode``, ``load``, ``taus``, ``relaxed`` (per tau) and ``discrete``.
    """
    modes = sorted({c["mode"] for c in curves})
    fig, axes = _pyplot().subplots(1, len(modes), figsize=(5.2 * len(modes), 3.8), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        rows = [c for c in curves if c["mode"] == mode]
        for i, c in enumerate(rows):
            color = _color(i)
            ax.plot(c["taus"], c["relaxed"], "o-", color=color, label=f"p = {c['load']:g}, relaxed")
            ax.axhline(c["discrete"], color=color, ls="--", lw=1, label=f"p = {c['load']:g}, discrete")
        ax.set_xscale("log")
        ax.set_xlabel("tau")
        ax.set_ylabel("mean delay, control steps")
        ax.set_title(f"{mode}D (relaxed) and {mode} (discrete)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)


def fd_error(rows: list[dict], steps: list[float], path: str) -> None:
    """Relative error of central finite differences against autograd vs the step, log-log.

    :input rows: ``mode``, ``input`` and ``rel_err`` (one value per step, None if undefined).
    """
    fig, ax = _pyplot().subplots(figsize=(5.6, 4.0))
    styles = {"L1": "-", "QA": "--"}
    inputs = sorted({r["input"] for r in rows})
    for r in rows:
        pts = [(h, e) for h, e in zip(steps, r["rel_err"], strict=True) if e is not None and e > 0]
        if not pts:
            continue
        color = _color(inputs.index(r["input"]))
        ax.plot(*zip(*pts, strict=True), marker="o", ls=styles.get(r["mode"], ":"), color=color,
                label=f"{r['mode']}D, d/d{r['input']}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("finite-difference step")
    ax.set_ylabel("|FD - autograd| / |autograd|")
    ax.set_title("Directional derivative of the KPI mix")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save(fig, path)


#: Units as an axis shows them.
_AXIS_UNIT = {"control steps": "steps"}
#: The calibration's KPIs (the registry's with a calibration-loss weight) the sweep figure leaves out:
#: energy (the report's caption: delay, delivery and AoI).
_SWEEP_OMITS = ("energy_j",)


def axis_label(k: kpi.Kpi) -> str:
    """A KPI's batch value as an axis names it, from the registry: ``mean <label>, <unit>`` for a mean
    (``mean delay, steps``), the batch key's words for a ratio (``delivery ratio``)."""
    name = f"mean {k.label}" if k.batch_key.startswith("mean_") else k.batch_key.replace("_", " ")
    return f"{name}, {_AXIS_UNIT.get(k.unit, k.unit)}" if k.unit else name


def sweep_kpis(sweep: dict) -> tuple:
    """The KPIs of :func:`calibration_sweep`'s panels, in the registry's order: those the calibration
    fits (``loss_weight > 0``) that the sweep holds, less ``_SWEEP_OMITS``."""
    return tuple(k for k in kpi.KPIS if k.loss_weight > 0 and k.key not in _SWEEP_OMITS
                 and k.batch_key in sweep["L2-legacy"])


# The constants of a calibration against the fleet size (the fleet row of :func:`calibration_sweep`).
_CONSTANTS = (("rate_factor", "capacity factor", True), ("snr_offset_db", "SNR offset, dB", False),
              ("sr_slots", "latency floor, slots", False), ("tau", "temperature tau", True),
              ("air_factor", "time on air: factor", True),
              ("air_crowd_exp", "time on air: crowd exponent", False))


def _fleet_row(axes, fleet: dict) -> None:
    """One panel per constant of ``_CONSTANTS``: its fitted value per model against R (log x)."""
    for ax, (key, label, log_y) in zip(axes, _CONSTANTS, strict=False):
        for m, (model, rows) in enumerate(fleet.items()):
            ax.plot([r["R"] for r in rows], [r[key] for r in rows], "o-", color=_color(m),
                    ms=3, label=model)
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("robots per cell R")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=6)


def calibration_sweep(sweep: dict, path: str, kpi_label: dict, fleet: dict | None = None) -> None:
    """Delay, delivery and AoI (:func:`sweep_kpis`) against p for each message size of the sweep:
    L2-legacy (black) against each model uncalibrated (dashed) and calibrated (solid); with
    ``fleet``, a first row of the fitted constants against the fleet size.

    :input sweep: ``points`` (p, size_bytes, ...), ``L2-legacy`` {kpi: [per point]} and
        ``models`` {model: {"uncalibrated"|"calibrated": {kpi: [per point]}}}.
    :input fleet: {model: [{"R", and each constant of ``_CONSTANTS``}]} (ascending R).
    """
    pts = sweep["points"]
    sizes = sorted({p[1] for p in pts})
    panels = sweep_kpis(sweep)
    kpis = tuple(k.batch_key for k in panels)
    ylabel = {k.batch_key: axis_label(k) for k in panels}
    top = 1 if fleet else 0
    cols = max(len(kpis), len(_CONSTANTS) if fleet else 0)
    fig, axes = _pyplot().subplots(len(sizes) + top, cols, figsize=(4.2 * cols, 3.2 * (len(sizes) + top)),
                                   squeeze=False)
    if fleet:
        _fleet_row(axes[0], fleet)
    for i, size in enumerate(sizes):
        idx = [j for j, p in enumerate(pts) if p[1] == size]
        ps = [pts[j][0] for j in idx]
        for ax, k in zip(axes[i + top], kpis, strict=False):
            ax.plot(ps, [sweep["L2-legacy"][k][j] for j in idx], "k-o", ms=3, lw=1.6, label="L2-legacy")
            for m, (model, curves) in enumerate(sweep["models"].items()):
                col = _color(m)
                label = model.replace("_", "D ", 1).replace("mean_field", "mean-field")
                for name, ls, lw in (("uncalibrated", "--", 0.9), ("calibrated", "-", 1.2)):
                    ax.plot(ps, [curves[name][k][j] for j in idx], ls=ls, lw=lw, color=col,
                            label=f"{label}, {name}")
            ax.set_xlabel("send probability p")
            ax.set_ylabel(ylabel[k])
            if k != "delivery_ratio":
                ax.set_yscale("log")
            ax.set_title(f"{kpi_label[k]}, {size / 1000:g} kB messages", fontsize=9)
            ax.grid(alpha=0.3, which="both")
        for ax in axes[i + top][len(kpis):]:
            ax.set_visible(False)
    axes[top][0].legend(fontsize=6, ncol=1)
    fig.tight_layout()
    save(fig, path)


def proxy_fit(payload: dict, path: str, targets: tuple[str, ...], kpi_label: dict) -> None:
    """Held-out predicted vs true per KPI, and proxy gradient vs L2-legacy FD (scaled).

    :input payload: ``_scatter`` {target: {"true", "pred"}}, ``summary`` (``level``,
        ``heldout_r2_<target>``) and ``table`` rows with ``proxy``, ``fd_mean``, ``fd_se``.
    """
    sc, s = payload["_scatter"], payload["summary"]
    fig, axes = _pyplot().subplots(1, len(targets) + 1, figsize=(3.4 * (len(targets) + 1), 3.4))
    for ax, k in zip(axes, targets, strict=False):
        t = np.array([np.nan if v is None else v for v in sc[k]["true"]], dtype=float)
        p = np.array(sc[k]["pred"], dtype=float)
        ax.scatter(t, p, s=3, alpha=0.4)
        ok = np.isfinite(t)
        if ok.any():
            lo, hi = min(t[ok].min(), p[ok].min()), max(t[ok].max(), p[ok].max())
            ax.plot([lo, hi], [lo, hi], "k:", lw=0.8)
        r2 = s[f"heldout_r2_{k}"]
        ax.set_title(f"{kpi_label[k]}: held-out R² {r2:.3g}" if r2 is not None else kpi_label[k], fontsize=9)
        ax.set_xlabel(f"{s['level']} (per robot)")
    axes[0].set_ylabel("proxy")
    ax = axes[-1]
    for r in payload["table"]:
        scale = abs(r["fd_mean"]) + 2 * r["fd_se"]
        if not scale:
            continue
        y = max(min(r["proxy"] / scale, 5.0), -5.0)
        ax.errorbar(r["fd_mean"] / scale, y, xerr=2 * r["fd_se"] / scale, fmt="o", ms=4)
    ax.plot([-1.2, 1.2], [-1.2, 1.2], "k:", lw=0.8)
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_title("per-robot gradients, one point per table row (scaled)", fontsize=8)
    ax.set_xlabel("L2-legacy FD ± 2 SE")
    ax.set_ylabel("proxy (clipped at ±5)")
    fig.tight_layout()
    save(fig, path)


def gradient_ratios(detail: list[dict], path: str, within: float) -> None:
    """Ratio model gradient / L2-legacy FD with its 95 % interval, one panel per operating
    point, one column of markers per derivative the FD resolves (symlog axis: a negative
    ratio is a sign disagreement; 1 is agreement in sign and size; the band is "within x2").
    Uncalibrated models as open markers, calibrated as filled ones in the same colour.

    :input detail: rows with ``model``, ``op``, ``held_out``, ``derivative``,
        ``fd_significant``, ``ratio``, ``ratio_lo``, ``ratio_hi``.
    """
    models = list(dict.fromkeys(d["model"] for d in detail))
    bases = list(dict.fromkeys(m.removesuffix(" cal") for m in models))
    ops = list(dict.fromkeys(d["op"] for d in detail))
    held = {d["op"]: d["held_out"] for d in detail}
    fig, axes = _pyplot().subplots(len(ops), 1, figsize=(11.0, 3.4 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops, strict=True):
        labels = list(dict.fromkeys(d["derivative"] for d in detail if d["op"] == op and d["fd_significant"]))
        for j, m in enumerate(models):
            rows = [d for d in detail if d["op"] == op and d["model"] == m and d["fd_significant"]]
            xs, ys, lo, hi = [], [], [], []
            for d in rows:
                r = max(min(d["ratio"], 1e3), -1e3)
                xs.append(labels.index(d["derivative"]) + (j - (len(models) - 1) / 2) * 0.09)
                ys.append(r)
                l_, h_ = d["ratio_lo"], d["ratio_hi"]
                lo.append(max(r - max(min(l_, 1e3), -1e3), 0.0) if math.isfinite(l_) else 0.0)
                hi.append(max(max(min(h_, 1e3), -1e3) - r, 0.0) if math.isfinite(h_) else 0.0)
            col = _color(bases.index(m.removesuffix(" cal")))
            cal = m.endswith(" cal")
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=4, color=col, mfc=col if cal else "none", label=m,
                        elinewidth=0.7, alpha=1.0 if cal else 0.6)
        ax.axhspan(1.0 / within, within, color="green", alpha=0.08, lw=0)
        ax.axhline(1.0, color="k", ls=":", lw=0.8)
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("model / L2-legacy FD")
        kind = "held-out point" if held[op] else "stage point"
        ax.set_title(f"{op} ({kind}): derivatives the FD resolves (|mean| > 2 SE), 95 % CI; "
                     f"open = uncalibrated, filled = calibrated", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=4)
    fig.tight_layout()
    save(fig, path)


def optimisation(payload: dict, path: str, title: str) -> None:
    """The held-out cost on ``level`` of each gradient run against the iteration (left), with the
    start, random search and the uniform policy as lines; each solution's cost on ``level`` per
    env as a box (right).

    :input payload: ``summary["level"]``, ``table`` rows (``solution``, ``cost``), ``history``
        {run: [{"iter", "level_cost_heldout"}]} and ``env_costs`` {solution: [per env]}.
    """
    s, by = payload["summary"], {r["solution"]: r for r in payload["table"]}
    lvl = s["level"]
    fig, (ax, bx) = _pyplot().subplots(1, 2, figsize=(12.0, 4.2), gridspec_kw={"width_ratios": [1.3, 1.0]})
    for name, hist in payload["history"].items():
        pts = [(h["iter"], h["level_cost_heldout"]) for h in hist if "level_cost_heldout" in h]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", ms=3, label=f"{name.removeprefix('gradient, ')}")
    for base, ls in (("start", ":"), ("random search", "--"), ("uniform policy", "-.")):
        if base in by:
            ax.axhline(by[base]["cost"], color="k", ls=ls, lw=1, label=base)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"cost on {lvl}, held-out sends (mean over envs)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    names = [r["solution"] for r in payload["table"]]
    bx.boxplot([payload["env_costs"][n] for n in names], orientation="horizontal", showfliers=True)
    bx.set_yticks(range(1, len(names) + 1))
    bx.set_yticklabels([n.removeprefix("gradient, ") for n in names], fontsize=7)
    bx.set_xscale("log")
    bx.set_xlabel(f"cost per env on {lvl}, held-out sends")
    bx.grid(alpha=0.3, which="both")
    fig.tight_layout()
    save(fig, path)


def fleet_opt(traces: dict, ref_s: dict, path: str, level: str) -> None:
    """Held-out cost on ``level`` of each method's solution so far, per fleet size: against wall
    time (log x, the budgets ``ref_s[R]`` x 1, 3, 10 dotted) and against the level's cell-rollouts
    (symlog x).

    :input traces: ``{R: {method: [rows with wall_s, rollouts, heldout_cost]}}``.
    :input ref_s: ``{R: the gradient's wall time, s}``.
    """
    sizes = list(traces)
    fig, axes = _pyplot().subplots(len(sizes), 2, figsize=(11.0, 3.6 * len(sizes)), squeeze=False)
    for (ax_t, ax_r), R in zip(axes, sizes, strict=True):
        for i, (name, rows) in enumerate(traces[R].items()):
            if not rows:
                continue
            style = dict(color=_color(i), lw=1.4, where="post", label=name)
            best = [r["heldout_cost"] for r in rows]
            ax_t.step([max(r["wall_s"], 1e-3) for r in rows], best, **style)
            ax_r.step([r["rollouts"] for r in rows], best, **style)
        for b in (1, 3, 10):
            ax_t.axvline(b * ref_s[R], color="0.6", ls=":", lw=1)
        ax_t.set_xscale("log")
        ax_r.set_xscale("symlog", linthresh=10)
        ax_t.set_xlabel("wall time, s (dotted: 1, 3, 10 x the gradient's)")
        ax_r.set_xlabel(f"{level} cell-rollouts (training)")
        for ax in (ax_t, ax_r):
            ax.set_ylabel(f"held-out cost of the solution, R = {R}")
            ax.grid(alpha=0.3)
        ax_r.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    save(fig, path)


def gpu_rows(rows: list[dict], path: str, device: str) -> None:
    """Cell-steps per second against the batch size E (log-log), one line per model and variant:
    the discrete levels (left), the relaxed models' forward + backward (right).

    :input rows: ``kind`` (discrete, diff), ``model``, ``variant``, ``E``, ``cell_steps_per_s``.
    """
    fig, axes = _pyplot().subplots(1, 2, figsize=(11.0, 4.0))
    styles = {"eager": "o-", "cuda_graph": "s--", "compiled": "s--"}
    for ax, kind, title in ((axes[0], "discrete", "discrete levels, forward"),
                            (axes[1], "diff", "relaxed models, forward + backward")):
        mine = [r for r in rows if r["kind"] == kind and r.get("cell_steps_per_s")]
        models = list(dict.fromkeys(r["model"] for r in mine))
        for r_model in models:
            color = _color(models.index(r_model))
            for variant in dict.fromkeys(r["variant"] for r in mine if r["model"] == r_model):
                pts = sorted((r["E"], r["cell_steps_per_s"]) for r in mine
                             if r["model"] == r_model and r["variant"] == variant)
                ax.plot(*zip(*pts, strict=True), styles.get(variant, "^:"), color=color,
                        label=f"{r_model}, {variant}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("E (cells in the batch), R = 8 robots each")
        ax.set_ylabel("cell-steps per second")
        ax.set_title(f"{device}: {title}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
