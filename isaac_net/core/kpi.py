"""KPI accumulation over a rollout, shared by the discrete levels and the relaxations (DESIGN.md §3)."""

from __future__ import annotations

import torch

from isaac_net.core import _validate

COUNT_KEYS = ("offered", "delivered", "delay_sum", "timeouts", "overflow", "energy_j", "aoi")


class KpiAccumulator:
    """Sums per-step ``[E, R]`` KPIs over steps ``t >= warmup`` and reduces them.

    Per robot ``[E, R]``: ``delay`` = delay sum / delivered (control steps; NaN where
    nothing was delivered), ``delivery`` = delivered / offered (NaN where nothing was
    offered), ``aoi`` = mean end-of-step AoI (control steps), ``energy_j`` = mean transmit
    energy per control step. Batch means (0-dim): ``mean_delay`` and ``delivery_ratio``
    are totals over totals, ``mean_aoi`` and ``mean_energy_j`` means over robots and steps.
    The totals (``offered, delivered, delay_sum, timeouts, overflow``) and the final
    ``queued_msgs`` are returned too.
    """

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.t = 0
        self.num_steps = 0
        self.sums: dict[str, torch.Tensor] = {}
        self.last: dict[str, torch.Tensor] = {}

    def add(self, kpis: dict) -> None:
        if self.t >= self.warmup:
            for k in COUNT_KEYS:
                self.sums[k] = kpis[k] if k not in self.sums else self.sums[k] + kpis[k]
            self.num_steps += 1
        self.last = kpis
        self.t += 1

    def set_totals(self, totals, last: dict, num_seen: int) -> None:
        """Take totals summed elsewhere (``COUNT_KEYS`` order) over the steps ``warmup..num_seen - 1``
        of a rollout, and its last step's KPIs ``last`` (a rollout run as one node)."""
        self.sums = dict(zip(COUNT_KEYS, totals, strict=True))
        self.last, self.t, self.num_steps = last, num_seen, max(num_seen - self.warmup, 0)

    def result(self) -> dict:
        if self.num_steps == 0:
            raise ValueError(f"warmup: expected fewer warm-up steps than the rollout's {self.t}")
        s = self.sums
        nan = torch.full_like(s["offered"], float("nan"))
        delivered, offered = s["delivered"], s["offered"]
        safe_delivered = torch.where(delivered > 0, delivered, 1.0)
        safe_offered = torch.where(offered > 0, offered, 1.0)
        out = {
            "delay": torch.where(delivered > 0, s["delay_sum"] / safe_delivered, nan),
            "delivery": torch.where(offered > 0, delivered / safe_offered, nan),
            "aoi": s["aoi"] / self.num_steps,
            "energy_j": s["energy_j"] / self.num_steps,
            "mean_delay": s["delay_sum"].sum() / delivered.sum(),
            "delivery_ratio": delivered.sum() / offered.sum(),
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
    if not (isinstance(warmup, int) and 0 <= warmup < T):
        raise ValueError(f"warmup: expected an integer in [0, T={T}), got {warmup!r}")


def rollout_dims(T, warmup, *tensors) -> tuple[int, int]:
    """``(E, R)`` from the broadcast of the ``[E, R]`` inputs of a rollout (None skipped)."""
    check_horizon(T, warmup)
    shapes = [tuple(t.shape) for t in tensors if isinstance(t, torch.Tensor)]
    if not shapes:
        raise ValueError("p: expected an [E, R] tensor (E envs, R robots) to size the rollout")
    shape = torch.broadcast_shapes(*shapes)
    if len(shape) != 2:
        raise ValueError(f"p: expected [E, R] inputs, got shapes {shapes}")
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
