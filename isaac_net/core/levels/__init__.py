"""The discrete engine levels and ``make_engine``. No import of ``isaac_net.core.diff``."""

from __future__ import annotations

import warnings

import torch

from isaac_net.core import _validate
from isaac_net.core.kpi import KPI_KEYS
from isaac_net.core.levels.base import DiscreteLevel
from isaac_net.core.levels.graphed import CudaGraphLevel
from isaac_net.core.levels.l1 import NetL1
from isaac_net.core.levels.l2_legacy import L2LegacyConfig, NetL2Legacy
from isaac_net.core.levels.qa import NetQA

LEVELS = {"L1": NetL1, "QA": NetQA, "L2-legacy": NetL2Legacy}
BACKENDS = ("eager", "numba", "cuda_graph")


def make_engine(level: str, E: int, R: int, device="cpu", *, cfg=None, dtype=torch.float32,
                seed: int | None = None, backend: str | None = None,
                **level_kwargs) -> DiscreteLevel | CudaGraphLevel:
    """Build a discrete engine level.

    :param level: one of ``LEVELS`` (``"L1"``, ``"QA"``, ``"L2-legacy"``).
    :param backend: ``None`` (the default): L2-legacy's ``"numba"`` on the CPU, ``"eager"`` elsewhere and
        for the other levels. ``"eager"``: torch ops. ``"numba"`` (L2-legacy, CPU only): each control
        step's slot loop one numba kernel (and its bookkeeping two more), the same events as eager from
        the same seed (docs/design.md
        §2). ``"cuda_graph"`` (CUDA only): each step is one replay of a CUDA graph captured at the first
        step (L2-legacy: at the first step of each of its phases; ``CudaGraphLevel``), the eager step's
        events from the same seed.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; expected one of: {', '.join(LEVELS)}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of: {', '.join(BACKENDS)}")
    device = _validate.check_device(device)
    if backend is None:
        backend = "numba" if level == "L2-legacy" and device.type == "cpu" else "eager"
    if backend == "cuda_graph" and device.type != "cuda":
        raise ValueError(f"backend 'cuda_graph' needs a CUDA device, got device={device!r}")
    if backend == "numba" and level != "L2-legacy":
        raise ValueError(f"backend {backend!r} is L2-legacy's; level {level!r} takes 'eager' or 'cuda_graph'")
    if level == "L2-legacy" and backend != "cuda_graph":
        level_kwargs = {**level_kwargs, "slot_loop": backend}
    net = LEVELS[level](E, R, device, cfg=cfg, dtype=dtype, seed=seed, **level_kwargs)
    return CudaGraphLevel(net) if backend == "cuda_graph" else net


__all__ = ["KPI_KEYS", "LEVELS", "CudaGraphLevel", "DiscreteLevel", "L2LegacyConfig", "NetL1",
           "NetL2Legacy", "NetQA", "make_engine"]


def __getattr__(name: str):
    # NetFluid was the discrete L1 level's name, though "fluid" means the relaxed models (DiffFluid).
    if name == "NetFluid":
        warnings.warn("NetFluid is deprecated: the discrete L1 level is NetL1", DeprecationWarning,
                      stacklevel=2)
        return NetL1
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
