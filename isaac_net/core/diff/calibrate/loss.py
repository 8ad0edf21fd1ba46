"""The calibration's loss: its target KPIs, their batch means over groups of envs, and the errors
of a model's KPIs against the targets (a level term per point and a slope term between
neighbouring points).

The KPI list, the weights and the grouping live together here: what a calibration fits is one
table.
"""

from __future__ import annotations

import math

import torch

from isaac_net.core import kpi

# The KPIs a calibration fits: the registry's entries with a loss weight (kpi.KPIS).
_FITTED = tuple(k for k in kpi.KPIS if k.loss_weight > 0)
#: The KPIs a calibration fits (batch means per operating point, :func:`group_kpis`), in order.
TARGET_KPIS = tuple(k.batch_key for k in _FITTED)
#: Weights of the loss terms (the registry's ``loss_weight``).
LOSS_WEIGHTS = {k.batch_key: k.loss_weight for k in _FITTED}
#: Delivery's error is counted in units of this (its registry ``loss_unit``); the others are log errors.
DELIVERY_UNIT = kpi.BY_BATCH_KEY["delivery_ratio"].loss_unit
# Weight of the slope term of the loss (the same errors on the change between neighbouring points,
# :func:`loss`) against the level term's 1: the calibration exists for its gradients.
SLOPE_WEIGHT = 1.0


def group_kpis(res: dict, n_groups: int) -> dict:
    """Batch KPIs ``[n_groups]`` of the fitted KPIs of consecutive groups of envs from a rollout's
    per-robot results, reduced as the rollout's batch means (``kpi.batch_kpis``)."""
    return kpi.grouped_batch_kpis(res, n_groups, _FITTED)


def _errors(model: dict, target: dict) -> tuple[dict, dict]:
    """Per KPI ``[..., n_points]``: the error in units of its ``loss_unit`` (delivery), else the log
    error (delay, AoI, energy); and where each is defined (``[n_points]`` bools).

    A target that delivered nothing has no delay (its ``mean_delay`` is the convention 0, not a
    delay) and one that sent nothing no energy to compare (0): e.g. a point at ``p = 0``. There the
    log error has no value and its term is left out (0, and so is every change to or from it in the
    slope term); the point still counts its delivery and AoI. A model that delivers nothing where
    the target does keeps an infinite error."""
    out, defined = {}, {}
    # Unit errors first, then log errors: the loss sums the terms in this order.
    for k in sorted(_FITTED, key=lambda k: k.loss_unit is None):
        b = k.batch_key
        if k.loss_unit is not None:
            out[b] = (model[b] - target[b]) / k.loss_unit
            defined[b] = torch.ones_like(target[b], dtype=torch.bool)
        else:
            defined[b] = target[b] > 0
            out[b] = torch.where(defined[b], torch.log(model[b]) - torch.log(target[b]), 0.0)
    return out, defined


def _weighted_squares(errors: dict) -> torch.Tensor:
    total = sum(LOSS_WEIGHTS[k] * e**2 for k, e in errors.items())
    return torch.where(torch.isfinite(total), total, math.inf)


def point_loss(model: dict, target: dict) -> torch.Tensor:
    """Loss per point ``[..., n_points]``: squared log errors of delay, AoI and energy plus the
    delivery error in units of ``DELIVERY_UNIT``, weighted by ``LOSS_WEIGHTS``. A model that
    delivers nothing where the target does has an infinite loss; a target without a delay or an
    energy (nothing delivered or sent, e.g. at ``p = 0``) leaves that term out (:func:`_errors`)."""
    return _weighted_squares(_errors(model, target)[0])


def neighbours(points, n_sizes: int = 1) -> torch.Tensor:
    """``[n_pairs, 2]`` indices ``(i, j)`` of neighbouring (fleet size, point)s of the points
    ``(p, msg_bytes, tx_dbm)`` taken at ``n_sizes`` fleet sizes, one size after the other (as
    :func:`concat_points`): at one size, two points that differ in one coordinate only, ``j``'s the
    next larger value of it among the points; and one point at two consecutive fleet sizes."""
    points = [tuple(float(v) for v in pt) for pt in points]
    n = len(points)
    values = [sorted({pt[d] for pt in points}) for d in range(3)]
    pairs = []
    for i, a in enumerate(points):
        for j, b in enumerate(points):
            differ = [d for d in range(3) if a[d] != b[d]]
            if len(differ) == 1:
                axis = values[differ[0]]
                if axis.index(b[differ[0]]) == axis.index(a[differ[0]]) + 1:
                    pairs.append((i, j))
    pairs = [(size * n + i, size * n + j) for size in range(n_sizes) for i, j in pairs]
    pairs += [(size * n + i, (size + 1) * n + i) for size in range(n_sizes - 1) for i in range(n)]
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def loss(model: dict, target: dict, pairs: torch.Tensor | None = None,
         slope_weight: float = SLOPE_WEIGHT) -> torch.Tensor:
    """The fit's loss ``[...]``: the mean :func:`point_loss` over the points (the level term) plus
    ``slope_weight`` times the same weighted squares of the errors' *changes* between the
    neighbours ``pairs`` (:func:`neighbours`), averaged over the pairs (the slope term).

    A KPI's slope along p, message size, power or fleet size is its change between neighbours;
    the slope term is the error of that change (``(m_j - m_i) - (t_j - t_i)`` on the log or
    delivery scale). Levels alone let a fit trade an error at one point against the opposite
    error at its neighbour, a slope of the wrong size: what a gradient-based user then follows.
    """
    errors, defined = _errors(model, target)
    total = _weighted_squares(errors).mean(-1)
    if pairs is None or not len(pairs) or slope_weight == 0:
        return total
    i, j = pairs[:, 0], pairs[:, 1]
    # A change to or from a point where the error has no value has none either.
    changes = {k: torch.where(defined[k][..., j] & defined[k][..., i], e[..., j] - e[..., i], 0.0)
               for k, e in errors.items()}
    return total + slope_weight * _weighted_squares(changes).mean(-1)



def _check_targets(targets: dict, name: str, n: int) -> None:
    """Targets must hold every KPI at each of the ``n`` (fleet size, point) pairs."""
    missing = [k for k in TARGET_KPIS if k not in targets]
    if missing:
        raise ValueError(f"{name}: expected the KPIs {list(TARGET_KPIS)}, missing {missing}")
    shapes = {k: tuple(targets[k].shape) for k in TARGET_KPIS}
    if any(shape[-1:] != (n,) for shape in shapes.values()):
        raise ValueError(f"{name}: expected {n} values per KPI (fleet sizes x points, one size after the "
                         f"other), got shapes {shapes}")

