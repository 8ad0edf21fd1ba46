"""Probe (30) (e): QAD's rate divided by ``smax(n, 1)^BETA`` (``n`` the robots backlogged): a cell's
capacity that falls with the robots it serves at once, as L2-legacy's per-robot costs (requests,
grants, retransmissions) would make it, against the capacity factor's level (``scaled.py``, which
patches ``model.MODES["QA"]``). BETA from the environment (or set ``crowd.BETA``)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaled  # noqa: E402

BETA = float(os.environ.get("BETA", "0"))
scaled.SCALE[0] = lambda alloc, sn: sn ** (-BETA)
