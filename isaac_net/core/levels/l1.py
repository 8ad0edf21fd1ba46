"""L1 (NetL1, the discrete L1 level): equal subband shares among backlogged robots, slot by slot
(docs/design.md §2)."""

from __future__ import annotations

import torch

from isaac_net.core import radio
from isaac_net.core.levels.base import DiscreteLevel, Queue, Service, StepContext, on_air_s, partial_remaining


class NetL1(DiscreteLevel):
    """For each of the K UL slots, ``share = S / max(n, 1)`` subbands per backlogged robot,
    ``se = min(log2(1 + snr / max(share, 1)), se_max)``, and ``share * se * subband_hz *
    slot_s / 8`` bytes offered to the robot, served FIFO. Unused capacity is lost. The transmit time
    is the bytes the robot sent at the rate of the whole band (:func:`~.base.on_air_s`).

    Calibration constants (``CellConfig``): the bytes per slot are scaled by ``rate_factor``,
    the SNR of the spectral efficiency is raised by ``snr_offset_db`` and a robot whose queue was
    empty before this step's capture is neither backlogged nor served in the first
    ``l1_sr_slots`` slots (its latency floor, as QA's SR offset).
    """

    name = "L1"
    capturable = True

    def _serve(self, q: Queue, ctx: StepContext) -> Service:
        cfg = self.cfg
        cum = q.bytes.cumsum(-1)  # [E, R, F] bytes queued up to and including each message
        total = cum[..., -1]  # [E, R]
        valid = q.valid
        snr_lin = radio.rate_snr_lin(ctx.snr_db, cfg)
        # Share, SE and rate depend on the slot only through n, the number of backlogged robots
        # of the cell: tabulate them for n = 0..R once per step, then each slot is a lookup.
        n_all = torch.arange(snr_lin.shape[-1] + 1, dtype=self.dtype, device=snr_lin.device)
        share_n = cfg.num_subbands / torch.clamp(n_all, min=1.0)  # [R + 1]
        se_n = torch.clamp(torch.log2(1.0 + snr_lin.unsqueeze(-1) / torch.clamp(share_n, min=1.0)),
                           max=cfg.se_max)
        rate_n = share_n * se_n * cfg.bytes_per_se_slot  # [E, R, R + 1] bytes per slot
        served = torch.zeros_like(total)  # bytes offered since the step began
        served_by_slot = []
        late = ctx.was_empty & ctx.captured  # waits l1_sr_slots slots for its first grant
        for k in range(cfg.num_slots):
            is_backlogged = served < total
            if k < cfg.l1_sr_slots:
                is_backlogged = is_backlogged & ~late
            n = is_backlogged.sum(-1, keepdim=True)  # [E, 1]
            rate = rate_n.gather(-1, n.expand_as(served).unsqueeze(-1)).squeeze(-1)
            served = served + torch.where(is_backlogged, rate, 0.0)
            served_by_slot.append(served)
        # A message finishes in the first slot whose cumulative service reaches its FIFO prefix.
        reached = torch.stack(served_by_slot).unsqueeze(-1) >= cum  # [K, E, R, F]
        done = valid & reached[-1]
        finish_slot = reached.to(torch.int8).argmax(0)  # first True (served never decreases)
        return Service(
            done=done,
            finish_s=(finish_slot + 1).to(self.dtype) * cfg.slot_s,
            remaining=partial_remaining(q, cum, served, done),
            tx_time_s=on_air_s(torch.minimum(served, total), snr_lin, cfg,
                               n_busy=(total > 0).sum(-1, keepdim=True)),
        )
