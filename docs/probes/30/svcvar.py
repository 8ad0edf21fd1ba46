"""Probe (30) (b): QAD with a robot's service rate varying from step to step, ``rate * xi`` with
``xi = exp(SIGMA z - SIGMA^2 / 2)`` (mean 1), ``z`` standard normal per step and robot index from a
fixed table (the same in every cell and every rollout: common random numbers across candidates),
through ``scaled.py`` (which patches ``model.MODES["QA"]``; eager: the table's row is a Python counter).
Also patches ``DiffFluid.inputs`` (each rollout starts the table at its first row). SIGMA from the
environment (or set ``svcvar.SIGMA``)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaled  # noqa: E402

from isaac_net.core.diff import model  # noqa: E402

SIGMA = float(os.environ.get("SIGMA", "0"))
_Z = torch.randn(512, 256, generator=torch.Generator().manual_seed(2026), dtype=torch.float64)
_COUNT = [0]


def _xi(alloc, sn):
    """The step's factors ``[1, R]`` (the table's next row), in ``alloc``'s dtype."""
    z = _Z[_COUNT[0] % _Z.shape[0], : alloc.shape[-1]]
    _COUNT[0] += 1
    return torch.exp(SIGMA * z - 0.5 * SIGMA**2).to(alloc.dtype).unsqueeze(0)


scaled.SCALE[0] = _xi
_inputs = model.DiffFluid.inputs


def _inputs_from_the_top(self, *args, **kwargs):
    _COUNT[0] = 0
    return _inputs(self, *args, **kwargs)


model.DiffFluid.inputs = _inputs_from_the_top
