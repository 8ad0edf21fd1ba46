"""KPI accumulation over a rollout, shared by the discrete levels and the relaxations (docs/design.md §3)."""

from __future__ import annotations

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


#: The per-step KPIs summed over a rollout, and all KPIs of a step (every level's ``step``), in one order.
COUNT_KEYS = Totals._fields
KPI_KEYS = (*COUNT_KEYS, "queued_msgs")

#: Floor of the delivered (offered) total in the batch ``mean_delay`` (``delivery_ratio``), messages:
#: a count a discrete level never takes between 0 and 1, and far below any relaxed count that
#: matters; it keeps the ratios and their gradients finite when nothing was delivered (offered).
MIN_COUNT_MSGS = 1e-6


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
    transmit energy per control step. Batch means (0-dim): ``mean_delay`` and ``delivery_ratio``
    are totals over totals, the denominator floored at ``MIN_COUNT_MSGS``: when nothing was
    delivered ``mean_delay`` is 0 (no delivered message has a delay) and when nothing was
    offered ``delivery_ratio`` is 0, finite with finite gradients (a float32 rollout whose
    deliveries underflow gives the same); ``mean_aoi`` and ``mean_energy_j`` are means over
    robots and steps. The totals (``offered, delivered, delay_sum, timeouts, overflow``) and
    the final ``queued_msgs`` are returned too.

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
        nan = torch.full_like(s["offered"], float("nan"))
        delivered, offered = s["delivered"], s["offered"]
        # where() on safe denominators: a 0/0 in the branch not taken would still give NaN gradients
        safe_delivered = torch.where(delivered > 0, delivered, 1.0)
        safe_offered = torch.where(offered > 0, offered, 1.0)
        out = {
            "delay": torch.where(delivered > 0, s["delay_sum"] / safe_delivered, nan),
            "delivery": torch.where(offered > 0, delivered / safe_offered, nan),
            "aoi": s["aoi"] / self.num_steps,
            "energy_j": s["energy_j"] / self.num_steps,
            "mean_delay": s["delay_sum"].sum() / delivered.sum().clamp_min(MIN_COUNT_MSGS),
            "delivery_ratio": delivered.sum() / offered.sum().clamp_min(MIN_COUNT_MSGS),
            "mean_aoi": s["aoi"].mean() / self.num_steps,
            "mean_energy_j": s["energy_j"].mean() / self.num_steps,
            "queued_msgs": self.last["queued_msgs"],
            "num_steps": self.num_steps,
        }
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
