"""The operating points of a calibration and the discrete level's KPIs there (the targets).

A point is ``(p, msg_bytes, tx_dbm)``; a :class:`Problem` batches the points' cells as envs, and
:func:`measure` runs the discrete level on it. Several fleet sizes are one set of points, one
size after the other (:func:`concat_points`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import torch

from isaac_net.core.config import CellConfig
from isaac_net.core.diff.calibrate.loss import group_kpis
from isaac_net.core.diff.reference import discrete_rollout
from isaac_net.core.levels import L2LegacyConfig


def fleet_sizes(R) -> tuple:
    """``R`` (robots per cell: an integer, or a sequence of distinct ones) as a tuple of ints >= 1."""
    sizes = (R,) if isinstance(R, (int, np.integer)) and not isinstance(R, bool) else R
    try:
        sizes = tuple(sizes)
    except TypeError:
        raise TypeError(f"R: expected an integer >= 1 or a sequence of them, got {R!r}") from None
    if isinstance(R, (str, bytes)) or not sizes or any(not _is_integer(r) or r < 1 for r in sizes):
        raise ValueError(f"R: expected an integer >= 1 or a non-empty sequence of them, got {R!r}")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"R: expected distinct fleet sizes, got {list(sizes)}")
    return tuple(int(r) for r in sizes)


def _one_fleet_size(R) -> int:
    """``R`` of one use of a calibration: one fleet size, an integer >= 1 (not a tuple of them, a
    float or a string, which ``int()`` would read or round)."""
    if isinstance(R, bool) or not isinstance(R, (int, np.integer)):
        hint = " (one of the fitted sizes, not the tuple)" if isinstance(R, (tuple, list)) else ""
        raise TypeError(f"R: expected one fleet size, an integer >= 1{hint}; got {R!r}")
    if R < 1:
        raise ValueError(f"R: expected one fleet size, an integer >= 1; got {R!r}")
    return int(R)


def concat_points(parts) -> dict:
    """KPIs ``{kpi: [..., n_points]}`` of several fleet sizes as one set of points, in order."""
    parts = list(parts)
    return {k: torch.cat([part[k] for part in parts], -1) for k in parts[0]}


def product_grid(p, msg_bytes, tx_dbm) -> tuple:
    """Operating points ``(p, msg_bytes, tx_dbm)``, the product of the three lists."""
    return tuple((float(a), float(b), float(c)) for a, b, c in itertools.product(p, msg_bytes, tx_dbm))



@dataclasses.dataclass(frozen=True)
class Problem:
    """The inputs of the operating points, batched as envs: point ``i`` is envs
    ``[i * envs, (i + 1) * envs)``.

    :field p, B, tx_dbm: ``[E, R]``; :field pos: ``[E, R, 2]`` m; :field u: ``[T, E, R]``.
    """

    points: tuple
    envs: int
    T: int
    warmup: int
    p: torch.Tensor
    B: torch.Tensor
    tx_dbm: torch.Tensor
    pos: torch.Tensor
    u: torch.Tensor

    def first(self, n: int) -> "Problem":
        """The first ``n`` envs of every point (the model's share of the target's envs)."""
        if n >= self.envs:
            return self
        idx = torch.arange(len(self.points) * self.envs).view(len(self.points), self.envs)[:, :n].reshape(-1)
        return dataclasses.replace(
            self,
            envs=n,
            p=self.p[idx],
            B=self.B[idx],
            tx_dbm=self.tx_dbm[idx],
            pos=self.pos[idx],
            u=self.u[:, idx],
        )


def problem(
    points,
    *,
    R: int,
    area_m=(40.0, 140.0),
    envs: int = 16,
    T: int = 60,
    warmup: int = 10,
    seed: int = 0,
    dtype=torch.float32,
) -> Problem:
    """Positions uniform in ``area_m`` squared and send uniforms for each point, from one seeded
    generator (the same on every machine)."""
    points = tuple(tuple(float(v) for v in pt) for pt in points)
    if not points:
        raise ValueError("points: expected at least one operating point (p, msg_bytes, tx_dbm)")
    for pt in points:
        if len(pt) != 3 or not (0 <= pt[0] <= 1) or pt[1] <= 0:
            raise ValueError(f"points: expected (p in [0, 1], msg_bytes > 0, tx_dbm), got {pt}")
    lo, hi = (float(a) for a in area_m)
    if not (0 <= lo < hi):
        raise ValueError(f"area_m: expected [low, high] with 0 <= low < high, got {list(area_m)}")
    g = torch.Generator().manual_seed(int(seed))
    n = len(points)
    E = n * envs
    per_env = torch.tensor(points, dtype=dtype).repeat_interleave(envs, 0)  # [E, 3]
    return Problem(
        points,
        envs,
        T,
        warmup,
        p=per_env[:, :1].expand(E, R).contiguous(),
        B=per_env[:, 1:2].expand(E, R).contiguous(),
        tx_dbm=per_env[:, 2:].expand(E, R).contiguous(),
        pos=lo + (hi - lo) * torch.rand(E, R, 2, generator=g, dtype=dtype),
        u=torch.rand(T, E, R, generator=g, dtype=dtype),
    )


def measure(
    prob: Problem,
    *,
    level: str = "L2-legacy",
    cfg: CellConfig | None = None,
    l2_cfg: L2LegacyConfig | None = None,
    seed: int = 0,
) -> dict:
    """KPIs ``{kpi: [n_points]}`` (float64) of the discrete level at each operating point."""
    kwargs = {"l2_cfg": l2_cfg} if level == "L2-legacy" and l2_cfg is not None else {}
    res = discrete_rollout(
        level,
        prob.T,
        prob.p,
        prob.B,
        pos=prob.pos,
        tx_dbm=prob.tx_dbm,
        warmup=prob.warmup,
        u=prob.u,
        cfg=cfg,
        dtype=prob.p.dtype,
        seed=seed,
        **kwargs,
    )
    return {k: v.double() for k, v in group_kpis(res, len(prob.points)).items()}


def _check_points(points, name: str, *, allow_empty: bool) -> None:
    """Operating points ``(p, msg_bytes, tx_dbm)``: ``p`` in [0, 1], a size > 0, finite numbers."""
    try:
        pts = [tuple(pt) for pt in points]
    except TypeError:
        raise TypeError(f"{name}: expected a sequence of points (p, msg_bytes, tx_dbm), "
                        f"got {points!r}") from None
    if not pts and not allow_empty:
        raise ValueError(f"{name}: expected at least one operating point (p, msg_bytes, tx_dbm), got none")
    for pt in pts:
        if len(pt) != 3 or not all(_is_number(v) and math.isfinite(v) for v in pt):
            raise ValueError(f"{name}: expected points (p, msg_bytes, tx_dbm) of finite numbers, got {pt!r}")
        if not (0 <= pt[0] <= 1 and pt[1] > 0):
            raise ValueError(f"{name}: expected points (p in [0, 1], msg_bytes > 0, tx_dbm), got {pt!r}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _is_integer(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

