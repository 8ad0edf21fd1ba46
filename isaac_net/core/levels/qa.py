"""QA (NetQA): one processor-sharing interval per control step (docs/design.md §2)."""

from __future__ import annotations

import torch

from isaac_net.core import radio
from isaac_net.core.levels.base import DiscreteLevel, Queue, Service, StepContext, on_air_s, partial_remaining


class NetQA(DiscreteLevel):
    """One interval per step: ``share = S / max(n, 1)``, power-headroom cap
    ``m = max(floor(snr / snr_req), 1)``, ``alloc = min(share, m)``, PF gain ``G = H(n)``,
    ``se = min(log2(1 + G snr / max(alloc, 1)), se_max)``, rate ``alloc se subband_hz / 8``
    B/s, service starting ``qa_sr_slots`` slots late for a robot whose queue was empty; the transmit
    time the bytes sent at the rate of the whole band, or at ``rate`` where the PF gain makes that the
    faster (:func:`~.base.on_air_s`).
    The calibration constants scale the rate by ``rate_factor`` and raise the SNR of the
    spectral efficiency and of the headroom cap by ``snr_offset_db``.
    """

    name = "QA"
    capturable = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # H(n) for n = 0..R, summed exactly (H(0) = 0 is never used: n >= 1 when served).
        inv = 1.0 / torch.arange(1, self.R + 1, dtype=torch.float64)
        self._harmonic = torch.cat([torch.zeros(1, dtype=torch.float64), inv.cumsum(0)]).to(
            self.dtype).to(self.device)

    def _serve(self, q: Queue, ctx: StepContext) -> Service:
        cfg = self.cfg
        cum = q.bytes.cumsum(-1)
        total = cum[..., -1]
        is_backlogged = total > 0
        n = is_backlogged.sum(-1, keepdim=True)  # [E, 1]
        share = cfg.num_subbands / torch.clamp(n, min=1).to(self.dtype)
        snr_lin = radio.rate_snr_lin(ctx.snr_db, cfg)
        req_lin = 10.0 ** (cfg.qa_snr_req_db / 10.0)
        m = torch.clamp(torch.floor(snr_lin / req_lin), min=1.0)
        alloc = torch.minimum(share, m)
        gain = self._harmonic[n]  # [E, 1]
        se = torch.clamp(torch.log2(1.0 + gain * snr_lin / torch.clamp(alloc, min=1.0)), max=cfg.se_max)
        rate = alloc * se * cfg.bytes_per_se_s  # B/s
        zero = torch.zeros_like(total)
        sr_s = torch.where(ctx.was_empty & ctx.captured, zero + cfg.qa_sr_slots * cfg.slot_s, zero)
        avail_s = cfg.step_s - sr_s
        served = rate * avail_s
        done = q.valid & (cum <= served.unsqueeze(-1))
        return Service(
            done=done,
            finish_s=sr_s.unsqueeze(-1) + cum / rate.unsqueeze(-1),
            remaining=partial_remaining(q, cum, served, done),
            tx_time_s=on_air_s(torch.minimum(served, total), snr_lin, cfg, own_rate=rate, n_busy=n),
        )
