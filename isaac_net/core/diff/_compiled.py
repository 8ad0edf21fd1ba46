"""torch.compile of the per-step body (imported only when ``compile=True``)."""

from __future__ import annotations

import torch

from isaac_net.core.diff.model import fluid_step

compiled_step = torch.compile(fluid_step, dynamic=False)
