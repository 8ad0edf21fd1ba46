"""Probe (31) (f): QA's static share serves the robots backlogged in a step side by side (processor
sharing): n robots with equal messages all finish at the end of their common busy time. L2-legacy's
scheduler gives a few robots the band at a time, and served one after another in a random order the
same robots finish on average half way, (n + 1) / 2 of a message's time alone. Here a message's share
of the interval is the mean of processor sharing's and of its prefix served at the rate it would have
alone (the whole band up to its headroom): ``(frac + frac * rate / rate_alone) / 2``, exact for equal
messages served in a random order. Only the finish times change: the bytes served and the completions
are the static share's (``scaled.py``'s service, through its FRAC hook; the reference step, compiled)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "30"))
import scaled  # noqa: E402  (patches model.MODES["QA"])
from isaac_net.core.diff import relax  # noqa: E402


def serial_frac(frac, rate, n, snr_lin, headroom, cfg, tau):
    """:input frac: ``[E, R, F]``. :input rate: ``[E, R]`` B/s at the static share. :output: ``[E, R, F]``."""
    full = torch.full_like(headroom, float(cfg.num_subbands))
    if relax.is_hard(tau):
        alloc = torch.minimum(full, headroom)
    else:
        alloc = headroom * relax.smin_const(full / headroom, 1.0, tau)
    se = relax.smin(torch.log2(1.0 + relax.harmonic(n) * snr_lin / relax.smax(alloc, 1.0, tau)), cfg.se_max, tau)
    alone = torch.where(rate > 0, alloc * se * cfg.bytes_per_se_s, 1.0)
    ratio = torch.clamp(rate / alone, max=1.0).unsqueeze(-1)
    return 0.5 * frac * (1.0 + ratio)


scaled.FRAC[0] = serial_frac
