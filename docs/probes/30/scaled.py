"""Probes (30) (b) and (e): QAD's service with its rate scaled by ``SCALE(alloc, n)`` (``[E, R]``,
``[E, 1]`` -> a factor broadcast to ``[E, R]``): QA's static share otherwise (``model._service_qa``
with the backlog closure of mean-field sends, and ``model._reshared_qa`` where ``qa_reshare > 0``,
copied with the one factor). Importing it patches ``model.MODES["QA"]`` (off the fused node: the reference step); ``svcvar.py`` and ``crowd.py`` set SCALE,
``docs/probes/31/serial.py`` FRAC, ``docs/probes/32/spread.py`` SPREAD and GAIN."""
import dataclasses

import torch

from isaac_net.core.diff import model, relax
from isaac_net.core.diff.model import _fifo_cum, _n_busy, on_air_s

SCALE = [lambda alloc, sn: 1.0]
#: The share of the interval a message's prefix takes, from processor sharing's ``frac`` (probe (31)
#: (f), ``docs/probes/31/serial.py``, sets it): ``FRAC[0](frac, rate, n, snr_lin, headroom, cfg, tau)``.
FRAC = [lambda frac, rate, n, snr_lin, headroom, cfg, tau: frac]
#: The subbands a robot's power is spread over (QA's ``smax(alloc, 1)``) and the PF gain (QA's ``H(n)``):
#: probe (32) (b), ``docs/probes/32/spread.py``, sets them.
SPREAD = [lambda alloc, tau: relax.smax(alloc, 1.0, tau)]
GAIN = [lambda n: relax.harmonic(n)]


def service(x, w, mass_before, snr_lin, headroom, cfg, tau, slot_grad="recompute"):
    cum = _fifo_cum(x)
    closure = cfg.mf_backlog_closure and not relax.is_hard(tau)  # mean-field sends (probe (32)), as QAD's
    if closure:
        busy, n, _ = relax.backlog_closure(w.sum(-1), deriv=False)
    else:
        n = _n_busy(w, tau)
    sn = relax.smax(n, 1.0, tau)
    share = cfg.num_subbands / sn
    if relax.is_hard(tau):
        alloc = torch.minimum(share, headroom)
    else:
        alloc = headroom * relax.smin_const(share / headroom, 1.0, tau)
    gain = GAIN[0](n)
    se = relax.smin(torch.log2(1.0 + gain * snr_lin / SPREAD[0](alloc, tau)), cfg.se_max, tau)
    rate = alloc * se * cfg.bytes_per_se_s * SCALE[0](alloc, sn)  # the probes' one factor
    rate = torch.where(rate > 0, rate, 1.0)
    if cfg.qa_reshare > 0:  # the re-shared interval (probe (32): with SPREAD / GAIN), as QAD's
        return model._reshared_qa(x, w, cum, mass_before, snr_lin, n, sn, rate, cfg, tau)
    sr_s = relax.soft_empty(mass_before, tau) * (cfg.qa_sr_slots * cfg.slot_s)
    avail_s = cfg.step_s - sr_s
    served = rate * avail_s * busy if closure else rate * avail_s
    c, frac, rest = relax.fifo_serve(x, cum, served.unsqueeze(-1), tau)
    frac = FRAC[0](frac, rate, n, snr_lin, headroom, cfg, tau)
    finish_s = sr_s.unsqueeze(-1) + frac * avail_s.unsqueeze(-1)
    air_s = on_air_s(x, rest, snr_lin, cfg, tau, own_rate=rate, n_busy=n)
    return c, c * finish_s / cfg.step_s, served, air_s, rest


model.MODES["QA"] = dataclasses.replace(model.MODES["QA"], service=service, fused_step=None)
