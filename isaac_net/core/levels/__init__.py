"""The discrete engine levels and ``make_engine``. No import of ``isaac_net.core.diff``."""

from __future__ import annotations

import torch

from isaac_net.core.levels.base import KPI_KEYS, DiscreteLevel
from isaac_net.core.levels.l1 import NetFluid
from isaac_net.core.levels.l2_legacy import L2LegacyConfig
from isaac_net.core.levels.qa import NetQA


def _l2_legacy(*args, **kwargs):
    from isaac_net.core.levels.l2_legacy import NetL2Legacy

    return NetL2Legacy(*args, **kwargs)


LEVELS = {"L1": NetFluid, "QA": NetQA, "L2-legacy": _l2_legacy}
BACKENDS = ("eager", "cuda_graph")


def make_engine(level: str, E: int, R: int, device="cpu", *, cfg=None, dtype=torch.float32,
                seed: int | None = None, backend: str = "eager", **level_kwargs) -> DiscreteLevel:
    """Build a discrete engine level.

    :param level: one of ``LEVELS`` (``"L1"``, ``"QA"``, ``"L2-legacy"``).
    :param backend: ``"eager"``; ``"cuda_graph"`` (CUDA only) is reserved for a captured step.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; expected one of: {', '.join(LEVELS)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of: {', '.join(BACKENDS)}")
    if backend == "cuda_graph":
        if torch.device(device).type != "cuda":
            raise ValueError(f"backend 'cuda_graph' needs a CUDA device, got device={device!r}")
        # Capturing the step needs the step counter on the device and no host-side branches;
        # not built yet (see the "Speed and scale" issue).
        raise NotImplementedError("backend 'cuda_graph' is not implemented yet; use backend='eager'")
    return LEVELS[level](E, R, device, cfg=cfg, dtype=dtype, seed=seed, **level_kwargs)


__all__ = ["KPI_KEYS", "LEVELS", "DiscreteLevel", "L2LegacyConfig", "NetFluid", "NetQA", "make_engine"]
