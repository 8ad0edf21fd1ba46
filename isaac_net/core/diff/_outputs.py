"""The named inputs and outputs of DiffFluid's step, shared by the reference step (``model._step``,
eager and compiled) and the fused QAD node (``_qa_step``).

Shapes as in ``model``: ``x``, ``w``, ``keep`` ``[E, R, A]`` (``[A, E, R]`` inside ``_qa_step``),
the rest ``[E, R]``.
"""

from __future__ import annotations

import typing

import torch

from isaac_net.core.kpi import Totals


class StepArgs(typing.NamedTuple):
    """The tensors one step reads (or their gradients, in the same places)."""

    x: torch.Tensor  # bytes left per message
    w: torch.Tensor  # mass per message
    aoi: torch.Tensor  # control steps
    send: torch.Tensor  # send weight in [0, 1]
    msg_bytes: torch.Tensor  # bytes
    snr_lin: torch.Tensor  # linear SNR
    tx_w: torch.Tensor  # transmit power, W
    keep: torch.Tensor  # per-step survival at each age
    headroom: torch.Tensor | None  # QAD's subband cap; None for L1D


class StepOut(typing.NamedTuple):
    """What one step gives: the next state ``(x, w, aoi)`` and the step's KPIs (expectations)."""

    x: torch.Tensor
    w: torch.Tensor
    aoi: torch.Tensor  # at the end of the step
    delivered: torch.Tensor
    delay_sum: torch.Tensor  # control steps
    timeouts: torch.Tensor
    overflow: torch.Tensor
    energy_j: torch.Tensor
    throughput_bytes_per_s: torch.Tensor  # delivered mass times the step's message size, over step_s
    queued_msgs: torch.Tensor  # at the end of the step


class RolloutEnd(typing.NamedTuple):
    """The state after a rollout and its last step's queue."""

    x: torch.Tensor
    w: torch.Tensor
    aoi: torch.Tensor
    queued_msgs: torch.Tensor


def split_rollout(outputs) -> tuple[RolloutEnd, Totals]:
    """``QARollout``'s flat outputs (or their gradients) ``(*RolloutEnd, *Totals)``, named."""
    n = len(RolloutEnd._fields)
    return RolloutEnd._make(outputs[:n]), Totals._make(outputs[n:])
