"""Probe (30): QAD with a robot's service rate varying from step to step, ``rate * xi`` with
``xi = exp(SIGMA z - SIGMA^2 / 2)`` (mean 1), ``z`` standard normal per step and robot index from a
fixed table (the same in every cell and every rollout: common random numbers across candidates).
QA's static share otherwise (``model._service_qa`` without the backlog closure or the re-shared time,
copied with the one line). Patches ``model.MODES["QA"]`` (off the fused node: the reference step, eager)
and ``DiffFluid.inputs`` (each rollout starts the table at its first row). SIGMA from the environment."""
import dataclasses, os

import torch

from isaac_net.core.diff import model, relax
from isaac_net.core.diff.model import _fifo_cum, _n_busy, on_air_s

SIGMA = float(os.environ.get("SIGMA", "0"))
_Z = torch.randn(512, 256, generator=torch.Generator().manual_seed(2026), dtype=torch.float64)
_COUNT = [0]


def _xi(like):
    """The step's factors ``[1, R]`` (the table's next row), in ``like``'s dtype."""
    z = _Z[_COUNT[0] % _Z.shape[0], : like.shape[-1]]
    _COUNT[0] += 1
    return torch.exp(SIGMA * z - 0.5 * SIGMA**2).to(like.dtype).unsqueeze(0)


def service(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad="recompute"):
    cum = _fifo_cum(x)
    n = _n_busy(w, tau)
    sn = relax.smax(n, 1.0, tau)
    share = cfg.num_subbands / sn
    if relax.is_hard(tau):
        alloc = torch.minimum(share, headroom)
    else:
        alloc = headroom * relax.smin_const(share / headroom, 1.0, tau)
    gain = relax.harmonic(n)
    se = relax.smin(torch.log2(1.0 + gain * snr_lin / relax.smax(alloc, 1.0, tau)), cfg.se_max, tau)
    rate = alloc * se * cfg.bytes_per_se_s * _xi(alloc)  # the probe's one line: the step's factor
    rate = torch.where(rate > 0, rate, 1.0)
    sr_s = relax.soft_empty(mass_before, tau) * (cfg.qa_sr_slots * cfg.slot_s)
    avail_s = cfg.step_s - sr_s
    served = rate * avail_s
    c, frac, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
    finish_s = sr_s.unsqueeze(-1) + frac * avail_s.unsqueeze(-1)
    return c, c * finish_s / cfg.step_s, served, on_air_s(x, rest, snr_lin, cfg, tau, own_rate=rate, n_busy=n), rest


model.MODES["QA"] = dataclasses.replace(model.MODES["QA"], service=service, fused_step=None)
_inputs = model.DiffFluid.inputs


def _inputs_from_the_top(self, *args, **kwargs):
    _COUNT[0] = 0
    return _inputs(self, *args, **kwargs)


model.DiffFluid.inputs = _inputs_from_the_top
