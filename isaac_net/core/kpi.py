"""KPI accumulation over a rollout, shared by the discrete levels and the relaxations (docs/design.md §3)."""

from __future__ import annotations

import dataclasses
import typing

import torch

from isaac_net.core import _validate


class Totals(typing.NamedTuple):
    """The per-step KPIs summed over a rollout's counted steps, ``[E, R]`` each."""

    offered: torch.Tensor  # messages
    delivered: torch.Tensor  # messages
    delay_sum: torch.Tensor  # control steps, over the delivered messages
    timeouts: torch.Tensor  # messages
    overflow: torch.Tensor  # messages
    aoi: torch.Tensor  # control steps, end-of-step AoI summed over steps
    energy_j: torch.Tensor  # J
    throughput_bytes_per_s: torch.Tensor  # B/s, the delivered messages' bytes over the step's duration


#: The per-step KPIs summed over a rollout, and all KPIs of a step (every level's ``step``), in one order.
COUNT_KEYS = Totals._fields
KPI_KEYS = (*COUNT_KEYS, "queued_msgs")

#: Floor of the delivered (offered) total in the batch ``mean_delay`` (``delivery_ratio``), messages:
#: a count a discrete level never takes between 0 and 1, and far below any relaxed count that
#: matters; it keeps the ratios and their gradients finite when nothing was delivered (offered).
MIN_COUNT_MSGS = 1e-6


@dataclasses.dataclass(frozen=True)
class Kpi:
    """One KPI: where a rollout's result holds it, how it is reduced, its unit, label and loss term.

    :field key: per-robot ``[E, R]`` key of a rollout's result (the proxy's target name).
    :field batch_key: batch key (0-dim, or one value per group of envs).
    :field unit: unit of the value (per robot and batch).
    :field label: short name for plots and tables.
    :field total: the ``Totals`` field summed over the counted steps: the numerator of a ratio KPI,
        or the per-step value of a KPI averaged over steps.
    :field per: the ``Totals`` field of the denominator (per robot ``total / per``, NaN where
        ``per`` is 0; batch: totals over totals, the denominator floored at ``MIN_COUNT_MSGS``),
        or None: the mean over the counted steps (per robot), and over robots (batch).
    :field loss_weight: weight of the KPI's squared error in the calibration loss (0: not fitted).
    :field loss_unit: the error is ``(model - target) / loss_unit``; None: ``log(model / target)``.
    :field proxy_target: the neural proxy learns the per-robot value (its file's heads, in this order).
    """

    key: str
    batch_key: str
    unit: str
    label: str
    total: str
    per: str | None
    loss_weight: float
    loss_unit: float | None
    proxy_target: bool


#: Every KPI, once, in the order of every table and plot.
KPIS = (
    Kpi("delay", "mean_delay", "control steps", "delay", total="delay_sum", per="delivered",
        loss_weight=1.0, loss_unit=None, proxy_target=True),
    Kpi("delivery", "delivery_ratio", "", "delivery", total="delivered", per="offered",
        loss_weight=1.0, loss_unit=0.1, proxy_target=True),
    Kpi("aoi", "mean_aoi", "control steps", "AoI", total="aoi", per=None,
        loss_weight=1.0, loss_unit=None, proxy_target=True),
    Kpi("energy_j", "mean_energy_j", "J per control step", "energy", total="energy_j", per=None,
        loss_weight=0.5, loss_unit=None, proxy_target=True),
    # Goodput: only delivered messages count, each with its size at capture. Not calibrated (weight 0)
    # and not a proxy target (the proxy's file keeps its four heads).
    Kpi("throughput_bytes_per_s", "mean_throughput_bytes_per_s", "B/s", "throughput",
        total="throughput_bytes_per_s", per=None, loss_weight=0.0, loss_unit=None, proxy_target=False),
)
#: The KPIs the neural proxy predicts, in its heads' order.
PROXY_KPIS = tuple(k for k in KPIS if k.proxy_target)
BY_KEY = {k.key: k for k in KPIS}
BY_BATCH_KEY = {k.batch_key: k for k in KPIS}
#: The batch keys, in the registry's order.
BATCH_KEYS = tuple(k.batch_key for k in KPIS)


def _sum(t: torch.Tensor, dim) -> torch.Tensor:
    return t.sum() if dim is None else t.sum(dim)


def _mean(t: torch.Tensor, dim) -> torch.Tensor:
    return t.mean() if dim is None else t.mean(dim)


def per_robot_kpis(totals: dict, num_steps: int) -> dict:
    """Per-robot KPIs ``{key: [E, R]}`` from the per-robot totals ``{Totals field: [E, R]}`` over
    ``num_steps`` counted steps, each as its registry entry declares."""
    out = {}
    for k in KPIS:
        num = totals[k.total]
        if k.per is None:
            out[k.key] = num / num_steps
            continue
        den = totals[k.per]
        # where() on a safe denominator: a 0/0 in the branch not taken would still give NaN gradients
        safe = torch.where(den > 0, den, 1.0)
        out[k.key] = torch.where(den > 0, num / safe, torch.full_like(num, float("nan")))
    return out


def batch_kpis(totals: dict, num_steps: int = 1, dim=None, kpis: tuple = KPIS) -> dict:
    """Batch KPIs ``{batch_key: ...}`` reduced over ``dim`` (None: every robot of every env) from
    per-robot values ``{name: [..., R]}``: a ratio KPI from its totals ``total`` and ``per`` (totals
    over totals, the denominator floored at ``MIN_COUNT_MSGS``), a step-mean KPI from ``total``
    summed over ``num_steps`` steps (or, with ``num_steps = 1``, its per-robot mean), averaged.

    The one batch reduction: ``KpiAccumulator.result`` (over everything), the optimisation's proxy
    cost and the sensitivity's replicates (over each env's or group's robots, ``dim=-1``). ``kpis``: the
    registry entries to reduce (default all)."""
    out = {}
    for k in kpis:
        if k.per is None:
            out[k.batch_key] = _mean(totals[k.total], dim) / num_steps
        else:
            out[k.batch_key] = _sum(totals[k.total], dim) / _sum(totals[k.per], dim).clamp_min(MIN_COUNT_MSGS)
    return out


def grouped_batch_kpis(res: dict, n_groups: int, kpis: tuple = KPIS) -> dict:
    """Batch KPIs ``[n_groups]`` of consecutive groups of envs from a rollout's per-robot result
    ``res`` (its totals, and the per-robot means of the step-mean KPIs); ``kpis`` as :func:`batch_kpis`."""
    names = {k.total for k in kpis} | {k.per for k in kpis if k.per is not None}
    return batch_kpis({n: res[n].reshape(n_groups, -1) for n in names}, dim=-1, kpis=kpis)


def expected_totals(offered: torch.Tensor, per_robot: dict, kpis: tuple = KPIS) -> dict:
    """Per-robot values for :func:`batch_kpis` from predicted per-robot KPIs ``per_robot`` (``{key:
    [..., R]}``, e.g. the proxy's) and the messages offered per step ``offered``: each ratio KPI's
    expected total is its denominator's times the KPI (delivered = offered delivery, delay sum =
    delivered delay), the step-mean KPIs their per-robot means; for the registry entries ``kpis``."""
    out = {"offered": offered}
    pending = [k for k in kpis if k.per is not None]
    while pending:  # a denominator may itself be a ratio KPI's total (delay per delivered message)
        ready = [k for k in pending if k.per in out]
        if not ready:
            raise ValueError(f"expected_totals: no denominator for {[k.key for k in pending]}")
        for k in ready:
            out[k.total] = out[k.per] * per_robot[k.key]
            pending.remove(k)
    out.update({k.total: per_robot[k.key] for k in kpis if k.per is None})
    return out


class KpiAccumulator:
    """Sums per-step ``[E, R]`` KPIs over steps ``t >= warmup`` and reduces them.

    The counted window starts with the messages already queued: at the first counted step
    ``t = warmup`` the messages queued at its start (``queued_msgs`` of step ``warmup - 1``;
    ``queued_start`` at ``warmup = 0``, the queue the rollout starts from, 0 after a reset) count
    as offered. So every message delivered, timed out or still queued in the window was
    offered in it: ``offered = delivered + timeouts + overflow + queued_msgs`` (final), and
    ``delivered <= offered``.

    Per robot ``[E, R]``: ``delay`` = delay sum / delivered (control steps; NaN where
    nothing was delivered), ``delivery`` = delivered / offered (NaN where nothing was
    offered), ``aoi`` = mean end-of-step AoI (control steps, >= 1), ``energy_j`` = mean
    transmit energy per control step, ``throughput_bytes_per_s`` = the delivered messages'
    bytes over the counted steps' duration (B/s: the mean of the per-step values, each over
    ``cfg.step_s``). Batch means (0-dim): ``mean_delay`` and ``delivery_ratio`` are totals
    over totals, the denominator floored at ``MIN_COUNT_MSGS``: when nothing was delivered
    ``mean_delay`` is 0 (no delivered message has a delay) and when nothing was offered
    ``delivery_ratio`` is 0, finite with finite gradients (a float32 rollout whose deliveries
    underflow gives the same); ``mean_aoi``, ``mean_energy_j`` and
    ``mean_throughput_bytes_per_s`` are means over robots and steps. The totals (``offered,
    delivered, delay_sum, timeouts, overflow``) and the final ``queued_msgs`` are returned too.

    :input queued_start: ``[E, R]`` messages queued before the first step (None: none).
    """

    def __init__(self, warmup: int, queued_start: torch.Tensor | None = None):
        self.warmup = warmup
        self.queued_start = queued_start
        self.t = 0
        self.num_steps = 0
        self.sums: dict[str, torch.Tensor] = {}
        self.last: dict[str, torch.Tensor] = {}

    def add(self, kpis: dict) -> None:
        if self.t >= self.warmup:
            if self.t == self.warmup:  # the window's first step: its queue counts as offered
                queued = self.last["queued_msgs"] if self.t > 0 else self.queued_start
                if queued is not None:
                    kpis = {**kpis, "offered": kpis["offered"] + queued}
            for k in COUNT_KEYS:
                self.sums[k] = kpis[k] if k not in self.sums else self.sums[k] + kpis[k]
            self.num_steps += 1
        self.last = kpis
        self.t += 1

    def set_totals(self, totals, last: dict, num_seen: int) -> None:
        """Take totals summed elsewhere (``COUNT_KEYS`` order, ``offered`` with the window's starting
        queue as in :meth:`add`) over the steps ``warmup..num_seen - 1`` of a rollout, and its last
        step's KPIs ``last`` (a rollout run as one node)."""
        self.sums = Totals._make(totals)._asdict()
        self.last, self.t, self.num_steps = last, num_seen, max(num_seen - self.warmup, 0)

    def result(self) -> dict:
        if self.num_steps == 0:
            raise ValueError(f"warmup: expected fewer warm-up steps than the rollout's {self.t}")
        s = self.sums
        out = {**per_robot_kpis(s, self.num_steps), **batch_kpis(s, self.num_steps),
               "queued_msgs": self.last["queued_msgs"], "num_steps": self.num_steps}
        for k in ("offered", "delivered", "delay_sum", "timeouts", "overflow"):
            out[k] = s[k]
        return out


def check_horizon(T, warmup) -> None:
    """A rollout of ``T >= 1`` control steps counts KPIs from step ``warmup`` in ``[0, T)``."""
    if not (isinstance(T, int) and not isinstance(T, bool) and T >= 1):
        raise ValueError(f"T: expected an integer >= 1 control steps, got {T!r}")
    if not (isinstance(warmup, int) and not isinstance(warmup, bool) and 0 <= warmup < T):
        raise ValueError(f"warmup: expected an integer in [0, T={T}), got {warmup!r}")


def rollout_dims(T, warmup, **tensors) -> tuple[int, int]:
    """``(E, R)`` from the broadcast of the named ``[E, R]`` inputs of a rollout (None skipped)."""
    check_horizon(T, warmup)
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    names = ", ".join(shapes) or "p"
    if not shapes:
        raise ValueError("p: expected an [E, R] tensor (E envs, R robots) to size the rollout")
    got = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    try:
        shape = torch.broadcast_shapes(*shapes.values())
    except RuntimeError:
        raise ValueError(f"{names}: expected [E, R] inputs that broadcast together, got {got}") from None
    if len(shape) != 2:
        raise ValueError(f"{names}: expected [E, R] inputs, got {got}")
    return int(shape[0]), int(shape[1])


def send_uniforms(u, T, E, R, dtype, device, generator):
    """Fixed uniforms ``[T, E, R]`` for the sends: ``u`` checked, or drawn from ``generator``."""
    if u is None:
        return torch.rand(T, E, R, generator=generator, dtype=dtype, device=device)
    if not isinstance(u, torch.Tensor) or list(u.shape) != [T, E, R]:
        got = list(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
        raise ValueError(f"u: expected uniforms of shape [T, E, R] = {[T, E, R]}, got {got}")
    u = _validate.per_robot(u, "u", T, E, dtype, device, trailing=(R,))
    _validate.check_range(u, "u", 0.0, 1.0, "uniforms in [0, 1]")
    return u
