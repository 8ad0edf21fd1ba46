"""Shared problems with known answers, and the tolerances of the checks (one table)."""

from __future__ import annotations

import dataclasses

import torch

from isaac_net.core import CellConfig

# Tolerances, in one place.
TOL = {
    "delay_sum_rel": 1e-4,  # discrete vs relaxed at tau = 0, and vs the hidden reference
    "energy_rel": 1e-4,
    "throughput_rel": 1e-4,
    "mass_abs": 1e-9,  # conservation residual, float64, per robot
    "fd_rel": 1e-4,  # autograd directional derivative vs central differences, float64
}

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", "cuda"] if CUDA else ["cpu"]


@dataclasses.dataclass
class Scenario:
    """A rollout scenario: ``[E, R]`` decisions, ``[T, E, R]`` uniforms and a CellConfig."""

    cfg: CellConfig
    T: int
    p: torch.Tensor
    B: torch.Tensor
    snr_db: torch.Tensor
    u: torch.Tensor
    deadline: torch.Tensor

    @property
    def E(self) -> int:
        return self.p.shape[0]

    @property
    def R(self) -> int:
        return self.p.shape[1]

    def to(self, dtype=torch.float64, device="cpu") -> "Scenario":
        f = lambda x: x.to(dtype=dtype, device=device)  # noqa: E731
        return Scenario(self.cfg, self.T, f(self.p), f(self.B), f(self.snr_db), f(self.u), f(self.deadline))


def seed_scenario(case: str, seed: int = 1, E: int = 8, R: int = 6, T: int = 50) -> Scenario:
    """The seed's equivalence cases: ``"normal"`` load, and ``"overload"`` with F = 4 and a
    6-step timeout where both the buffer and the deadline bind; ``"calibrated"``: the normal
    load with calibration constants of the size a fit to L2-legacy gives (capacity factor,
    SNR offset, L1 latency floor, a longer QA SR offset)."""
    g = torch.Generator().manual_seed(seed)
    if case == "normal":
        cfg, p, scale = CellConfig(), 0.4, 1.0
    elif case == "overload":
        cfg, p, scale = CellConfig(buffer_msgs=4, timeout_steps=6), 0.9, 4.0
    elif case == "calibrated":
        cfg, p, scale = CALIBRATED, 0.5, 1.0
    else:
        raise ValueError(case)
    B = scale * torch.where(torch.rand(E, R, generator=g) < 0.5, 4000.0, 30000.0)
    snr = 10.0 + 20.0 * torch.rand(E, R, generator=g)
    u = torch.rand(T, E, R, generator=g)
    deadline = torch.randint(2, cfg.timeout_steps + 1, (E, R), generator=g).float()
    return Scenario(cfg, T, torch.full((E, R), p), B, snr, u, deadline).to()


CALIBRATED = CellConfig(rate_factor=0.6, snr_offset_db=5.0, l1_sr_slots=12, qa_sr_slots=20, air_factor=1.8,
                        air_crowd_exp=0.5)


def random_scenario(seed: int, calibrated: bool = False) -> Scenario:
    """Fresh random scenario: random R, F, timeout, subbands, deadlines, sizes, SNRs, load;
    with ``calibrated``, random calibration constants too (the other draws unchanged)."""
    g = torch.Generator().manual_seed(1000 + seed)
    ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    timeout = ri(2, 10)
    cfg = CellConfig(num_subbands=ri(1, 16), buffer_msgs=ri(1, 8), timeout_steps=timeout,
                     num_slots=ri(2, 40), qa_sr_slots=1)
    E, R, T = ri(1, 5), ri(1, 10), ri(10, 40)
    p = torch.rand(E, R, generator=g)
    B = 500.0 + 60000.0 * torch.rand(E, R, generator=g) ** 2
    snr = -5.0 + 40.0 * torch.rand(E, R, generator=g)
    u = torch.rand(T, E, R, generator=g)
    deadline = torch.randint(1, timeout + 1, (E, R), generator=g).float()
    if calibrated:
        K = cfg.num_slots
        cfg = dataclasses.replace(cfg, rate_factor=0.3 + 0.9 * float(torch.rand((), generator=g)),
                                  snr_offset_db=-6.0 + 16.0 * float(torch.rand((), generator=g)),
                                  l1_sr_slots=ri(0, K), qa_sr_slots=ri(0, K))
        # the time on air's constants drawn last (the draws before them as without)
        cfg = dataclasses.replace(cfg, air_factor=0.3 + 5.0 * float(torch.rand((), generator=g)),
                                  air_crowd_exp=-0.5 + 2.0 * float(torch.rand((), generator=g)))
        # QA's re-shared time drawn after them: none in about a third of the scenarios
        reshare = float(torch.rand((), generator=g))
        cfg = dataclasses.replace(cfg, qa_reshare=0.0 if reshare < 0.3 else reshare)
        # QA's fewest subbands a robot's power is spread over drawn last: QA's 1 in about a third
        grant = float(torch.rand((), generator=g))
        width = 1.0 if grant < 0.3 else 1.0 + (cfg.num_subbands - 1) * grant
        cfg = dataclasses.replace(cfg, qa_min_grant_subbands=width)
    return Scenario(cfg, T, p, B, snr, u, deadline).to()
