"""L1 (NetFluid): equal subband shares among backlogged robots, slot by slot (DESIGN.md §2)."""

from __future__ import annotations

import torch

from isaac_net.core import radio
from isaac_net.core.levels.base import DiscreteLevel, Queue, Service, StepContext, partial_remaining


class NetFluid(DiscreteLevel):
    """For each of the K UL slots, ``share = S / max(n, 1)`` subbands per backlogged robot,
    ``se = min(log2(1 + snr / max(share, 1)), se_max)``, and ``share * se * subband_hz *
    slot_s / 8`` bytes offered to the robot, served FIFO. Unused capacity is lost.
    """

    name = "L1"

    def _serve(self, q: Queue, ctx: StepContext) -> Service:
        cfg = self.cfg
        cum = q.bytes.cumsum(-1)  # [E, R, F] bytes queued up to and including each message
        total = cum[..., -1]  # [E, R]
        valid = q.valid
        snr_lin = radio.db_to_lin(ctx.snr_db)
        bytes_per_sb_se = cfg.subband_hz * cfg.slot_s / 8.0
        served = torch.zeros_like(total)  # bytes offered since the step began
        tx_time = torch.zeros_like(total)
        finish_slot = torch.full(q.bytes.shape, -1, dtype=torch.long, device=self.device)
        for k in range(cfg.num_slots):
            is_backlogged = served < total
            n = is_backlogged.sum(-1, keepdim=True).to(self.dtype)  # [E, 1]
            share = cfg.num_subbands / torch.clamp(n, min=1.0)
            se = torch.clamp(torch.log2(1.0 + snr_lin / torch.clamp(share, min=1.0)), max=cfg.se_max)
            cap = share * se * bytes_per_sb_se
            served = served + torch.where(is_backlogged, cap, torch.zeros_like(cap))
            tx_time = tx_time + torch.where(is_backlogged, torch.clamp(share, max=1.0) * cfg.slot_s,
                                            torch.zeros_like(tx_time))
            is_new = valid & (finish_slot < 0) & (served.unsqueeze(-1) >= cum)
            finish_slot = torch.where(is_new, torch.full_like(finish_slot, k), finish_slot)
        done = finish_slot >= 0
        return Service(
            done=done,
            finish_s=(finish_slot + 1).to(self.dtype) * cfg.slot_s,
            remaining=partial_remaining(q, cum, served, done),
            tx_time_s=tx_time,
        )
