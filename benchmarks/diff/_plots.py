"""Figures of the stages. Agg backend, no timestamps or software version in the metadata,
so that a rerun with the same numbers writes the same bytes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_METADATA = {"Software": None, "Date": None}
_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def save(fig, path: str) -> None:
    fig.savefig(path, dpi=110, metadata=_METADATA)
    plt.close(fig)


def convergence_curves(curves: list[dict], path: str) -> None:
    """Mean delay of the relaxed model vs tau (log x), the discrete value as a dashed line.

    :input curves: rows with ``mode``, ``load``, ``taus``, ``relaxed`` (per tau) and ``discrete``.
    """
    modes = sorted({c["mode"] for c in curves})
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 3.8), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        rows = [c for c in curves if c["mode"] == mode]
        for i, c in enumerate(rows):
            color = _COLORS[i % len(_COLORS)]
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
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    styles = {"L1": "-", "QA": "--"}
    inputs = sorted({r["input"] for r in rows})
    for r in rows:
        pts = [(h, e) for h, e in zip(steps, r["rel_err"], strict=True) if e is not None and e > 0]
        if not pts:
            continue
        color = _COLORS[inputs.index(r["input"]) % len(_COLORS)]
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
