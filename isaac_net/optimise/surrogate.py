"""A neural proxy (:mod:`isaac_net.core.diff.proxy`) for a fleet's decisions: fitted at the fleet's
``R`` on packet-level rollouts over the ranges its decisions span, so that Adam can run through
it (:func:`~isaac_net.optimise.methods.gradient` with ``proxy=``).

A proxy is fitted at one fleet size; the ranges follow the fleet: message sizes those of its
classes, SNR what its positions give between the power bounds, and send probabilities up to
``load_max / R`` (a 64-robot cell near its knee sends a few messages a step, not 0.95 x 64). The
fit's own cost (its rollouts and wall time) is what a user pays once per cell configuration, as
for a calibration.
"""

from __future__ import annotations

import time

from isaac_net.core import CellConfig, radio


def proxy_ranges(decisions, cfg: CellConfig, load_max: float) -> dict:
    """The proxy's sampling ranges for ``decisions`` (a :class:`~isaac_net.optimise.FleetDecisions`):
    ``p`` from its lower bound to ``min(upper, load_max / R)``, ``msg_bytes`` the fleet's sizes,
    ``snr_db`` its robots' SNR between the power bounds (in ``cfg``)."""
    if not (isinstance(load_max, (int, float)) and load_max > 0):
        raise ValueError(f"load_max: expected messages per step per cell > 0, got {load_max!r}")
    f = decisions.fleet
    (p_lo, p_hi), (t_lo, t_hi) = decisions.p_bounds, decisions.tx_bounds_dbm
    p_top = min(p_hi, float(load_max) / f.R)
    if not p_top > p_lo:
        raise ValueError(f"load_max: {load_max} / R = {p_top:.3g} is not above p_bounds' lower {p_lo}")
    snr_lo = float(radio.snr_db(f.pos, t_lo, cfg).min())
    snr_hi = float(radio.snr_db(f.pos, t_hi, cfg).max())
    return {"p": (max(p_lo, 1e-3), p_top), "msg_bytes": (float(f.B.min()), float(f.B.max())),
            "snr_db": (snr_lo, snr_hi)}


def fit_proxy(decisions, *, level: str = "L2-legacy", cfg: CellConfig | None = None, robots: int = 5120,
              test_share: float = 0.2, T: int = 60, warmup: int = 10, load_max: float = 16.0,
              hidden=(64, 64), epochs: int = 300, lr: float = 3e-3, batch_size: int = 256, seed: int = 0,
              batch_cells: int | None = None) -> tuple:
    """Collect ``level`` rollouts of about ``robots`` robots (cells of the fleet's ``R``) over
    :func:`proxy_ranges` and fit a proxy on all but the last ``test_share`` of the cells.

    :returns: ``(proxy, info)``; ``info``: ``cells``, ``rollouts`` (cells x 1), ``wall_collect_s``,
        ``wall_fit_s``, ``wall_s``, ``ranges`` and the held-out fit quality per KPI (``heldout``:
        ``{kpi: {r2, mean_rel_err, n}}``).
    """
    from isaac_net.core.diff import proxy as px

    cfg = CellConfig() if cfg is None else cfg
    if not 0.0 < float(test_share) < 1.0:
        raise ValueError(f"test_share: expected a share in (0, 1), got {test_share!r}")
    R = decisions.fleet.R
    cells = max(2, -(-int(robots) // R))
    n_test = max(1, round(cells * float(test_share)))
    ranges = proxy_ranges(decisions, cfg, load_max)
    t0 = time.perf_counter()
    data = px.collect(level, cells, R, int(T), warmup=int(warmup), seed=int(seed), ranges=ranges, cfg=cfg,
                      dtype=decisions.fleet.B.dtype, batch_cells=batch_cells)
    t1 = time.perf_counter()
    train = data["cell"] < cells - n_test
    proxy, _ = px.fit(data["x"][train], data["y"][train], hidden=tuple(hidden), epochs=int(epochs),
                      lr=float(lr), batch_size=int(batch_size), seed=int(seed), ranges=ranges,
                      fitted_on=data["meta"])
    t2 = time.perf_counter()
    held = px.evaluate(proxy, data["x"][~train], data["y"][~train])
    info = {"cells": cells, "test_cells": n_test, "rollouts": cells, "wall_collect_s": t1 - t0,
            "wall_fit_s": t2 - t1, "wall_s": t2 - t0, "ranges": {k: list(v) for k, v in ranges.items()},
            "heldout": held}
    return proxy, info
