"""A heterogeneous fleet: robot classes, the cells drawn from a seed, and the per-robot decisions.

Each cell holds ``R`` robots; a class takes a share of them (the same count in every cell, robots of
a class contiguous: :attr:`Fleet.class_slices`), with message sizes and distances to the gNB drawn
uniformly in its ranges, a weight in the cost and a delivery floor
(:func:`~isaac_net.optimise.cost.fleet_cost`).
The decisions are each robot's send probability ``p`` and transmit power ``tx_dbm``, both bounded.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from isaac_net.optimise.gradient import bounded, unbounded


def _pair(v, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in v)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a pair (lo, hi) of numbers, got {v!r}") from None
    return lo, hi


@dataclasses.dataclass(frozen=True)
class RobotClass:
    """A kind of robot. Sizes and distances are drawn uniformly in ``[lo, hi]``.

    :param share: fraction of each cell's robots, > 0 (shares are normalised).
    :param size_bytes: ``(lo, hi)`` message size, bytes.
    :param distance_m: ``(lo, hi)`` distance to the gNB, m.
    :param weight: the class's weight in the cost, >= 0.
    :param delivery_min: the class's delivery floor in [0, 1] (the cost's penalty below it).
    """

    name: str
    share: float
    size_bytes: tuple[float, float]
    distance_m: tuple[float, float]
    weight: float = 1.0
    delivery_min: float = 0.95

    def __post_init__(self):
        for field in ("size_bytes", "distance_m"):
            lo, hi = _pair(getattr(self, field), f"{self.name}.{field}")
            if not 0 < lo <= hi:
                raise ValueError(f"{self.name}.{field}: expected 0 < lo <= hi, got ({lo}, {hi})")
            object.__setattr__(self, field, (lo, hi))
        if not (math.isfinite(self.share) and self.share > 0):
            raise ValueError(f"{self.name}.share: expected > 0, got {self.share}")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"{self.name}.weight: expected >= 0, got {self.weight}")
        if not 0.0 <= self.delivery_min <= 1.0:
            raise ValueError(f"{self.name}.delivery_min: expected in [0, 1], got {self.delivery_min}")


#: A fleet of small telemetry near to far, large camera frames near the gNB and mid-size
#: inspection scans at the cell edge (the issue's ~1-60 kB, near the gNB to the edge).
DEFAULT_CLASSES = (
    RobotClass("telemetry", 0.5, (1e3, 2e3), (20.0, 200.0), weight=0.3, delivery_min=0.99),
    RobotClass("camera", 0.25, (30e3, 60e3), (20.0, 80.0), weight=0.3, delivery_min=0.9),
    RobotClass("inspection", 0.25, (8e3, 20e3), (150.0, 250.0), weight=0.4, delivery_min=0.95),
)


@dataclasses.dataclass(frozen=True)
class Fleet:
    """``E`` cells of ``R`` robots, drawn by :func:`make_fleet`.

    :attr B: ``[E, R]`` message sizes, bytes. :attr pos: ``[E, R, 2]`` positions, m (gNB at the origin).
    :attr u_train: ``[T, E, R]`` send uniforms the optimisers score on; :attr u_test: ``[T, E, R]``
        held-out ones (another stream), with which every solution is scored.
    :attr class_slices: the robots of each class (contiguous, the same in every cell).
    """

    classes: tuple
    class_slices: tuple
    B: torch.Tensor
    pos: torch.Tensor
    u_train: torch.Tensor
    u_test: torch.Tensor
    seed: int

    @property
    def E(self) -> int:
        return self.B.shape[0]

    @property
    def R(self) -> int:
        return self.B.shape[1]


def class_counts(shares, R: int) -> list[int]:
    """Robots per class in a cell of ``R``: shares normalised, rounded by largest remainder."""
    total = float(sum(shares))
    raw = [s / total * R for s in shares]
    counts = [int(math.floor(r)) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: counts[i] - raw[i])[:R - sum(counts)]:
        counts[i] += 1
    return counts


def make_fleet(E: int, R: int, T: int, *, classes=DEFAULT_CLASSES, seed: int = 0,
               dtype: torch.dtype = torch.float32, device="cpu") -> Fleet:
    """Draw ``E`` cells of ``R`` robots of ``classes`` and ``T`` steps of training and held-out send
    uniforms, all from ``seed`` (on the CPU, then moved to ``device``)."""
    for name, v in (("E", E), ("R", R), ("T", T)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    classes = tuple(classes)
    if not classes or not all(isinstance(c, RobotClass) for c in classes):
        raise TypeError("classes: expected a non-empty sequence of RobotClass")
    counts = class_counts([c.share for c in classes], R)
    if min(counts) < 1:
        raise ValueError(f"R: {R} robots leave a class empty (counts {counts} for shares "
                         f"{[c.share for c in classes]})")
    g = torch.Generator().manual_seed(int(seed))
    sizes, dist = [], []
    for c, n in zip(classes, counts, strict=True):
        (s_lo, s_hi), (d_lo, d_hi) = c.size_bytes, c.distance_m
        sizes.append(s_lo + (s_hi - s_lo) * torch.rand(E, n, generator=g, dtype=dtype))
        dist.append(d_lo + (d_hi - d_lo) * torch.rand(E, n, generator=g, dtype=dtype))
    d = torch.cat(dist, 1)
    angle = 2 * math.pi * torch.rand(E, R, generator=g, dtype=dtype)
    bounds = [0, *itertools.accumulate(counts)]
    u_train = torch.rand(T, E, R, generator=g, dtype=dtype)
    u_test = torch.rand(T, E, R, generator=torch.Generator().manual_seed(int(seed) + 10_000), dtype=dtype)
    pos = torch.stack([d * angle.cos(), d * angle.sin()], -1)
    return Fleet(classes=classes, class_slices=tuple(slice(a, b) for a, b in itertools.pairwise(bounds)),
                 B=torch.cat(sizes, 1).to(device), pos=pos.to(device), u_train=u_train.to(device),
                 u_test=u_test.to(device), seed=int(seed))



class FleetDecisions:
    """Per-robot send probability and transmit power of a :class:`Fleet`, each bounded.

    The protocol the optimisers use: ``init() -> theta`` (unconstrained, ``[E, R]`` each, with
    gradients), ``__call__(theta) -> dec`` (``p, tx_dbm, B`` ``[E, R]``, ``pos`` ``[E, R, 2]``),
    ``extra_cost(dec) -> [E]`` (0 here); for the black-box methods ``from_unit(x) -> dec`` and
    ``to_unit(dec) -> x`` (``x`` ``[n E, 2 R]`` in [0, 1], candidate-major: row ``j E + e`` is
    candidate ``j`` of cell ``e``; ``p`` in the first ``R`` columns, the power in the last ``R``),
    ``sample(n, gen)`` and ``uniform(policies)``.

    The unit cube's coordinate of ``p`` is set by ``p_scale``: ``"log"`` (the default),
    ``x = (ln p - ln lo) / (ln hi - ln lo)``, or ``"linear"``, ``x = (p - lo) / (hi - lo)``; the
    power's is linear in dBm (already a log quantity). Why log: a send probability spans orders of
    magnitude (a good ``p`` scales about as ``1 / R`` with the robots of a cell), and on the log
    scale equal steps in the cube are equal factors of ``p``, so a black-box method's default step
    (CMA-ES's ``sigma0``, random search's and TPE's uniform draws) is as sensible at 64 robots a
    cell as at 8; on the linear scale a 64-robot cell's start (``p`` ~ 0.06) sits at the cube's
    lower face and almost all of the cube overloads it. The gradient's path (``init``,
    ``__call__``: ``p`` sigmoid-bounded in ``p_bounds``) does not depend on ``p_scale``.

    :param p_bounds: ``(lo, hi)`` send probability per control step, in [0, 1] (``lo > 0`` with
        ``p_scale="log"``).
    :param tx_bounds_dbm: ``(lo, hi)`` transmit power, dBm.
    :param p_init, tx_init_dbm: the start, the same for every robot (strictly inside the bounds).
    :param p_scale: ``"log"`` or ``"linear"``: how the unit cube maps to ``p`` (above).
    """

    #: The scales of ``p`` on the unit cube (``p_scale``).
    P_SCALES = ("log", "linear")

    def __init__(self, fleet: Fleet, *, p_bounds=(0.02, 0.98), tx_bounds_dbm=(0.0, 23.0),
                 p_init: float = 0.5, tx_init_dbm: float = 20.0, p_scale: str = "log"):
        if not isinstance(fleet, Fleet):
            raise TypeError(f"fleet: expected a Fleet, got {type(fleet).__name__}")
        if p_scale not in self.P_SCALES:
            raise ValueError(f"p_scale: expected one of {', '.join(map(repr, self.P_SCALES))}, "
                             f"got {p_scale!r}")
        self.fleet = fleet
        self.p_scale = p_scale
        self.p_bounds = _pair(p_bounds, "p_bounds")
        self.tx_bounds_dbm = _pair(tx_bounds_dbm, "tx_bounds_dbm")
        if not 0.0 <= self.p_bounds[0] < self.p_bounds[1] <= 1.0:
            raise ValueError(f"p_bounds: expected 0 <= lo < hi <= 1, got {self.p_bounds}")
        if p_scale == "log" and self.p_bounds[0] <= 0.0:
            raise ValueError(f"p_bounds: expected lo > 0 with p_scale='log', got {self.p_bounds}")
        if not self.tx_bounds_dbm[0] < self.tx_bounds_dbm[1]:
            raise ValueError(f"tx_bounds_dbm: expected lo < hi, got {self.tx_bounds_dbm}")
        for name, v, (lo, hi) in (("p_init", p_init, self.p_bounds),
                                  ("tx_init_dbm", tx_init_dbm, self.tx_bounds_dbm)):
            if not lo < float(v) < hi:
                raise ValueError(f"{name}: expected strictly inside ({lo}, {hi}), got {v}")
        self.p_init, self.tx_init_dbm = float(p_init), float(tx_init_dbm)

    def init(self) -> dict:
        f = self.fleet
        full = {"p": unbounded(self.p_init, *self.p_bounds),
                "tx": unbounded(self.tx_init_dbm, *self.tx_bounds_dbm)}
        return {k: torch.full((f.E, f.R), v, dtype=f.B.dtype, device=f.B.device, requires_grad=True)
                for k, v in full.items()}

    def __call__(self, theta: dict) -> dict:
        return {"p": bounded(theta["p"], *self.p_bounds), "tx_dbm": bounded(theta["tx"], *self.tx_bounds_dbm),
                "B": self.fleet.B, "pos": self.fleet.pos}

    def extra_cost(self, dec: dict) -> torch.Tensor:
        return torch.zeros(dec["p"].shape[0], dtype=torch.float64, device=dec["p"].device)

    def from_unit(self, x) -> dict:
        """Decisions of unit-cube points ``x`` ``[n E, 2 R]`` (numpy or torch; clipped to [0, 1])."""
        f = self.fleet
        x = torch.as_tensor(x, dtype=f.B.dtype).to(f.B.device).clamp(0.0, 1.0)
        if x.ndim != 2 or x.shape[1] != 2 * f.R or x.shape[0] % f.E:
            raise ValueError(f"x: expected [n * {f.E}, {2 * f.R}], got {list(x.shape)}")
        n = x.shape[0] // f.E
        (p_lo, p_hi), (t_lo, t_hi) = self.p_bounds, self.tx_bounds_dbm
        xp = x[:, :f.R]
        if self.p_scale == "log":
            p = torch.exp(math.log(p_lo) + (math.log(p_hi) - math.log(p_lo)) * xp).clamp(p_lo, p_hi)
        else:
            p = p_lo + (p_hi - p_lo) * xp
        return {"p": p, "tx_dbm": t_lo + (t_hi - t_lo) * x[:, f.R:],
                "B": f.B.repeat(n, 1), "pos": f.pos.repeat(n, 1, 1)}

    def to_unit(self, dec: dict) -> torch.Tensor:
        """The unit-cube point ``[n E, 2 R]`` (float64, CPU) of decisions ``dec`` (the inverse of
        :meth:`from_unit`; ``p`` and the power clipped to their bounds)."""
        (p_lo, p_hi), (t_lo, t_hi) = self.p_bounds, self.tx_bounds_dbm
        p = dec["p"].detach().double().cpu().clamp(p_lo, p_hi)
        tx = dec["tx_dbm"].detach().double().cpu()
        if self.p_scale == "log":
            xp = (p.log() - math.log(p_lo)) / (math.log(p_hi) - math.log(p_lo))
        else:
            xp = (p - p_lo) / (p_hi - p_lo)
        return torch.cat([xp, (tx - t_lo) / (t_hi - t_lo)], 1).clamp(0.0, 1.0)

    def sample(self, n: int, gen: torch.Generator) -> dict:
        """``n`` uniform draws per cell on the unit cube (candidate-major; so log-uniform ``p`` with
        ``p_scale="log"``), from ``gen`` on the CPU."""
        x = torch.rand(n * self.fleet.E, 2 * self.fleet.R, generator=gen, dtype=torch.float64)
        return self.from_unit(x)

    def uniform(self, policies) -> dict:
        """Decisions of the uniform policies ``[(p, tx_dbm)]``: one p and one power for every robot
        of every cell, cells repeated per policy (policy-major)."""
        f = self.fleet
        pol = torch.tensor([[float(p), float(t)] for p, t in policies], dtype=f.B.dtype, device=f.B.device)
        n = pol.shape[0]
        pol = pol.repeat_interleave(f.E, 0)  # [n E, 2]
        return {"p": pol[:, :1].expand(n * f.E, f.R).contiguous(),
                "tx_dbm": pol[:, 1:].expand(n * f.E, f.R).contiguous(),
                "B": f.B.repeat(n, 1), "pos": f.pos.repeat(n, 1, 1)}
