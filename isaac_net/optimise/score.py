"""Scoring on the packet level, with the budget of every method counted in one place.

:class:`Scorer` runs the discrete level (L2-legacy by default) on decisions of a fleet: ``train``
with the fleet's training send uniforms (what the black-box methods optimise; counted in
cell-rollouts) and ``heldout`` with the held-out uniforms and another engine seed (what every
solution is reported on; counted apart). Candidates of all cells are batched candidate-major
(row ``j E + e``: candidate ``j`` of cell ``e``) into one rollout and all see the cell's send
uniforms; L2-legacy's fading and HARQ draws depend on a cell's index in the batch, so the
random numbers are common across candidates for the sends only.

:class:`Run` is one method's clock and budget: wall time (``time.perf_counter``, held-out scoring
excluded) and training cell-rollouts since it started, and the trace of the held-out cost of the
method's current solution against both.
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from isaac_net.optimise.cost import chunked_rollouts, fleet_cost


@dataclasses.dataclass(frozen=True)
class Budget:
    """A method's budget: wall time ``wall_s`` (s, one core) and/or L2-legacy cell-rollouts
    ``rollouts`` (of ``T`` steps, training scoring); None is unlimited, one must be set."""

    wall_s: float | None = None
    rollouts: int | None = None

    def __post_init__(self):
        if self.wall_s is None and self.rollouts is None:
            raise ValueError("budget: expected wall_s or rollouts (or both), got neither")
        if self.wall_s is not None and not (math.isfinite(self.wall_s) and self.wall_s > 0):
            raise ValueError(f"wall_s: expected a positive number of seconds, got {self.wall_s}")
        r = self.rollouts
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise ValueError(f"rollouts: expected a positive int, got {self.rollouts!r}")


class Scorer:
    """The cost of decisions on a discrete level.

    :param fleet: the :class:`~isaac_net.optimise.fleet.Fleet`.
    :param cost: ``weights`` and ``penalty`` of :func:`~isaac_net.optimise.cost.fleet_cost`.
    :param T: steps per rollout (at most the fleet's uniforms), ``warmup`` of them not counted.
    :param seed: the level's seed for training scores (held-out: ``seed + 7``).
    :param chunk_cells: cells per rollout call (None: one call).
    :attr rollouts: training cell-rollouts so far; :attr heldout_rollouts: held-out ones.
    """

    def __init__(self, fleet, cost: dict, *, T: int, warmup: int, level: str = "L2-legacy", cfg=None,
                 seed: int = 0, chunk_cells: int | None = None, **engine_kwargs):
        if not 0 <= warmup < T <= fleet.u_train.shape[0]:
            raise ValueError(f"T: expected warmup < T <= {fleet.u_train.shape[0]} (the fleet's uniforms), "
                             f"got T={T}, warmup={warmup}")
        if set(cost) < {"weights", "penalty"}:
            raise ValueError(f"cost: expected keys weights and penalty, got {sorted(cost)}")
        self.fleet, self.cost, self.T, self.warmup = fleet, cost, int(T), int(warmup)
        self.level, self.cfg, self.seed = level, cfg, int(seed)
        self.chunk_cells, self.engine_kwargs = chunk_cells, engine_kwargs
        self.rollouts = self.heldout_rollouts = 0

    def _cost(self, dec: dict, u: torch.Tensor, seed: int) -> torch.Tensor:
        parts = chunked_rollouts(self.level, self.T, self.warmup, dec, u,
                                 lambda res: fleet_cost(res, self.fleet, self.cost), cfg=self.cfg, seed=seed,
                                 dtype=self.fleet.B.dtype, chunk=self.chunk_cells, **self.engine_kwargs)
        c = torch.cat(parts).cpu().double()
        return torch.where(torch.isfinite(c), c, torch.full_like(c, math.inf))

    def train(self, dec: dict) -> torch.Tensor:
        """Training cost ``[n, E]`` of ``dec`` with ``n E`` cells (candidate-major)."""
        E = self.fleet.E
        n = dec["p"].shape[0] // E
        self.rollouts += n * E
        return self._cost(dec, self.fleet.u_train.repeat(1, n, 1), self.seed).reshape(n, E)

    def heldout(self, dec: dict) -> torch.Tensor:
        """Held-out cost ``[E]`` of one decision per cell (held-out sends, engine seed ``seed + 7``)."""
        self.heldout_rollouts += self.fleet.E
        return self._cost(dec, self.fleet.u_test, self.seed + 7)


class Run:
    """One method's wall clock (held-out scoring excluded), rollouts and trace against ``budget``.

    ``offset_s`` and ``offset_rollouts`` are charged up front (a hybrid's gradient stage)."""

    def __init__(self, scorer: Scorer, budget: Budget, *, offset_s: float = 0.0, offset_rollouts: int = 0):
        if not isinstance(budget, Budget):
            raise TypeError(f"budget: expected a Budget, got {type(budget).__name__}")
        self.scorer, self.budget = scorer, budget
        self.offset_s, self.offset_rollouts = float(offset_s), int(offset_rollouts)
        self._t0, self._paused = time.perf_counter(), 0.0
        self._r0, self._charged = scorer.rollouts, 0
        self.trace: list[dict] = []

    @property
    def wall_s(self) -> float:
        return self.offset_s + time.perf_counter() - self._t0 - self._paused

    @property
    def rollouts(self) -> int:
        return self.offset_rollouts + self._charged + self.scorer.rollouts - self._r0

    def charge(self, rollouts: int) -> None:
        """Count ``rollouts`` cell-rollouts spent outside the scorer (a caller's own objective)."""
        self._charged += int(rollouts)

    def exhausted(self, next_rollouts: int = 0) -> bool:
        """Whether the budget is spent, or the next ``next_rollouts`` would overrun it."""
        b = self.budget
        return ((b.wall_s is not None and self.wall_s >= b.wall_s)
                or (b.rollouts is not None and self.rollouts + next_rollouts > b.rollouts))

    def record(self, dec: dict) -> torch.Tensor:
        """Score the method's current solution ``dec`` (its own pick, made without the held-out
        sends) held out, off the clock; append a trace row and return its cost ``[E]``. Rows:
        ``wall_s``, ``rollouts``, ``heldout_cost`` (mean over cells) and ``heldout_cells`` (the
        ``E`` per-cell costs, for paired comparisons at a budget: :func:`solution_at`)."""
        t = time.perf_counter()
        wall, rollouts = self.wall_s, self.rollouts
        cost = self.scorer.heldout(dec)
        self.trace.append({"wall_s": wall, "rollouts": rollouts, "heldout_cost": float(cost.mean()),
                           "heldout_cells": cost.tolist()})
        self._paused += time.perf_counter() - t
        return cost


def solution_at(trace: list, *, wall_s: float | None = None, rollouts: int | None = None) -> dict | None:
    """The row of a :meth:`Run.record` trace a method stands at when its budget runs out: the last
    one recorded within ``wall_s`` and ``rollouts`` (None: no limit); None where none is. Its
    solution is the method's own pick (the gradient's iterate, CMA-ES's mean, the best on the
    training sends): choosing the row by its held-out cost would fit on the evaluation sends."""
    rows = [r for r in trace if (wall_s is None or r["wall_s"] <= wall_s)
            and (rollouts is None or r["rollouts"] <= rollouts)]
    return rows[-1] if rows else None
