"""Probe (32) (b): QA's static share (``docs/probes/30/scaled.py``'s copy of ``model._service_qa``, off the
fused node) with the crowd's lift of the per-subband SNR weakened in one of two ways (environment):
``GRANT_SB`` K, a robot's power spread over at least K subbands (``smax(alloc, K)`` where QA has
``smax(alloc, 1)``: L2-legacy's PF grants a backlogged robot the subbands its buffer needs, more than
the band's even share in a crowd), and ``PF_EXP`` k, the proportional-fair gain ``H(n)^k`` (QA's k = 1).
Importing it patches ``model.MODES["QA"]`` (through ``scaled.py``); with ``BETA`` in the environment the rate
also carries probe (30) (e)'s crowd factor ``smax(n, 1)^-BETA`` (``docs/probes/30/crowd.py``)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "30"))
import scaled  # noqa: E402  (patches model.MODES["QA"])
from isaac_net.core.diff import relax  # noqa: E402

GRANT_SB = float(os.environ.get("GRANT_SB", "1"))
PF_EXP = float(os.environ.get("PF_EXP", "1"))
if GRANT_SB != 1.0:
    scaled.SPREAD[0] = lambda alloc, tau: relax.smax(alloc, GRANT_SB, tau)
if PF_EXP != 1.0:  # exp(k log G): no infinite derivative at G = 0 (nothing is served there)
    scaled.GAIN[0] = lambda n: torch.exp(PF_EXP * torch.log(torch.clamp(relax.harmonic(n), min=1e-30)))
if os.environ.get("BETA"):  # with probe (30) (e)'s crowd factor on the rate, smax(n, 1)^-BETA
    import crowd  # noqa: E402, F401  (sets scaled.SCALE)
if os.environ.get("POOL"):  # probe (29)'s pooled share in place of the re-shared interval (qa_reshare > 0)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "29"))
    import pool  # noqa: E402, F401  (patches model._reshared_qa)
