"""QA (NetQA): one processor-sharing interval per control step (docs/design.md §2)."""

from __future__ import annotations

import torch

from isaac_net.core import radio
from isaac_net.core.levels.base import DiscreteLevel, Queue, Service, StepContext, on_air_s, partial_remaining


def _level_of(need: torch.Tensor, target: torch.Tensor, n: torch.Tensor, reshare: float) -> tuple:
    """The level ``L`` where ``f(L) = reshare sum_j min(need_j, L) + (1 - reshare) n L`` reaches
    ``target``, at most the largest need: ``(L [E, 1], f(L) [E, 1])``.

    ``need`` ``[E, R]`` >= 0 (0: a robot that takes no part), ``target`` and ``n`` ``[E, 1]`` > 0.
    ``f`` is continuous, piecewise linear and increasing; with ``need`` sorted its value at the k-th
    smallest is ``reshare (prefix_k + (R - k) need_(k)) + (1 - reshare) n need_(k)``, and the root lies
    on the first segment that reaches ``target``. Past the largest need every robot is done: ``L`` is
    that need and ``f(L) < target`` (the time left over is the caller's).
    """
    R = need.shape[-1]
    v, _ = torch.sort(need, dim=-1)
    prefix = v.cumsum(-1)
    k = torch.arange(1, R + 1, dtype=need.dtype, device=need.device)
    at_knots = reshare * (prefix + (R - k) * v) + (1.0 - reshare) * n * v  # f at L = v_(k), k = 1..R
    below = (at_knots <= target).sum(-1, keepdim=True)  # knots at or below the target: 0..R
    all_done = below >= R
    kk = torch.clamp(below, max=R - 1)
    p = torch.where(kk > 0, prefix.gather(-1, torch.clamp(kk - 1, min=0)), torch.zeros_like(target))
    L = (target - reshare * p) / (reshare * (R - kk).to(need.dtype) + (1.0 - reshare) * n)
    return torch.where(all_done, v[..., -1:], L), torch.where(all_done, at_knots[..., -1:], target)


class NetQA(DiscreteLevel):
    """One interval per step: ``share = S / max(n, 1)``, power-headroom cap
    ``m = max(floor(snr / snr_req), 1)``, ``alloc = min(share, m)``, PF gain ``G = H(n)``,
    ``se = min(log2(1 + G snr / max(alloc, K)), se_max)`` (``K = qa_min_grant_subbands``, 1 by default),
    rate ``alloc se subband_hz / 8``
    B/s, service starting ``qa_sr_slots`` slots late for a robot whose queue was empty; the transmit
    time the bytes sent at the rate of the whole band, or at ``rate`` where the PF gain makes that the
    faster (:func:`~.base.on_air_s`).
    The calibration constants scale the rate by ``rate_factor`` and raise the SNR of the
    spectral efficiency and of the headroom cap by ``snr_offset_db``; with ``qa_reshare`` > 0 the
    share ``qa_reshare`` of the time of a robot not being served goes to the others (:meth:`_reshared`).
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
        # the power over max(alloc, K) subbands: K = 1 its share (at least one subband), K > 1 a wider grant
        spread = torch.clamp(alloc, min=cfg.qa_min_grant_subbands)
        se = torch.clamp(torch.log2(1.0 + gain * snr_lin / spread), max=cfg.se_max)
        rate = alloc * se * cfg.bytes_per_se_s  # B/s
        if cfg.qa_reshare > 0:
            return self._reshared(q, ctx, cum, total, is_backlogged, n, rate, snr_lin)
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

    def _reshared(self, q: Queue, ctx: StepContext, cum, total, is_backlogged, n, rate, snr_lin) -> Service:
        """The interval with the share ``a = qa_reshare`` of an idle robot's time re-shared.

        All ``n`` backlogged robots served, each is served at ``rate``; a robot not being served (its
        queue drained, or a robot whose queue was empty before its SR, ``qa_sr_slots`` slots) leaves
        the share ``a`` of its time to the others. In the "level" ``l`` of the step (a robot's seconds
        of service at ``rate``), ``dt / dl = a n' / n + (1 - a)`` with ``n'`` robots being served, so the
        time of level ``l`` is ``a sum_j min(V_j, l) / n + (1 - a) l``, robot j needing
        ``V_j = bytes_j / rate_j``; the early robots reach ``L_s`` by the SR time, the step ends at the
        level ``L`` (:func:`_level_of`). ``a = 1``: every robot's time goes to the others; ``a -> 0``:
        the static share. The transmit time is at ``rate`` (more of the band's time, not a faster one).
        """
        cfg, a = self.cfg, float(self.cfg.qa_reshare)
        nf = torch.clamp(n, min=1).to(self.dtype)
        rate = torch.where(is_backlogged, rate, 1.0)
        zero = torch.zeros_like(total)
        need = torch.where(is_backlogged, total / rate, zero)  # V: s of service at rate
        late = is_backlogged & ctx.was_empty & ctx.captured
        early_need = torch.where(late, zero, need)
        sr_s = min(cfg.qa_sr_slots * cfg.slot_s, cfg.step_s)
        # Up to the SR time the early robots; all of them done before it: the rest of it idle.
        L_s, f_s = _level_of(early_need, nf * sr_s, nf, a)
        idle_s = sr_s - f_s / nf
        # After it every robot: robot j's level W_j (a late robot joins at L_s); the step ends where
        # a (sum_j min(W_j, L) - n_late L_s) + (1 - a) n L reaches n (step - idle).
        n_late = late.sum(-1, keepdim=True).to(self.dtype)
        W = torch.where(late, need + L_s, need)
        if sr_s < cfg.step_s:
            L, _ = _level_of(W, nf * (cfg.step_s - idle_s) + a * n_late * L_s, nf, a)
        else:  # the SR fills the step: a late robot is not served
            L, _ = _level_of(early_need, nf * cfg.step_s, nf, a)
            W = torch.where(late, torch.full_like(need, float("inf")), W)
        start = torch.where(late, L_s, zero)  # the level a robot's service starts at
        # A robot whose level is reached is done (its bytes exactly: no rounding of rate (W - start)).
        served = torch.where(W <= L, total, torch.minimum(rate * torch.clamp(L - start, min=0.0), total))
        done = q.valid & (cum <= served.unsqueeze(-1))
        Wf = torch.where(torch.isinf(W), zero, W)

        def time_at(level):  # [E, R, K] levels -> [E, R, K] s
            lv = level.unsqueeze(-1)  # against the cell's robots [E, 1, 1, R]
            one = torch.minimum(lv, early_need[:, None, None, :]).sum(-1)
            two = torch.minimum(lv, Wf[:, None, None, :]).sum(-1) - (n_late * L_s).unsqueeze(-1)
            t_one = a * one / nf.unsqueeze(-1) + (1.0 - a) * level
            t_two = idle_s.unsqueeze(-1) + a * two / nf.unsqueeze(-1) + (1.0 - a) * level
            return torch.where(level <= L_s.unsqueeze(-1), t_one, t_two)

        finish_s = time_at(start.unsqueeze(-1) + cum / rate.unsqueeze(-1))
        return Service(
            done=done,
            finish_s=finish_s,
            remaining=partial_remaining(q, cum, served, done),
            tx_time_s=on_air_s(torch.minimum(served, total), snr_lin, cfg, own_rate=rate, n_busy=n),
        )
