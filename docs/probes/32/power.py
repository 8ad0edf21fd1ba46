"""Probe (32) (a): the fit's loss on the training points of one transmit power only (a diagnostic:
which side of the fit's balance between the two powers `fleet24`'s row follows). Importing it patches
``calibrate.search.loss``: on the training grid (12 or more points; the grid's powers alternate,
``product_grid``'s last axis, 23 dBm at even indices) the level term keeps the points of
``POWER_KEEP`` (environment: 23 or 13) and the slope term the pairs between kept points; held-out
sets (fewer points, one power) are left whole."""
import os

import torch

import importlib
_loss = importlib.import_module("isaac_net.core.diff.calibrate.loss")
search = importlib.import_module("isaac_net.core.diff.calibrate.search")

KEEP_EVEN = {"23": True, "13": False}[os.environ["POWER_KEEP"]]


def loss(model, target, pairs=None, slope_weight=_loss.SLOPE_WEIGHT):
    n = next(iter(target.values())).shape[-1]
    if n < 12:
        return _loss.loss(model, target, pairs, slope_weight)
    keep = torch.arange(n) % 2 == (0 if KEEP_EVEN else 1)
    idx = torch.nonzero(keep).flatten()
    new_of = torch.full((n,), -1, dtype=torch.long)
    new_of[idx] = torch.arange(len(idx))
    sub = lambda d: {k: v[..., idx] for k, v in d.items()}  # noqa: E731
    if pairs is not None and len(pairs):
        both = keep[pairs[:, 0]] & keep[pairs[:, 1]]
        pairs = new_of[pairs[both]]
    return _loss.loss(sub(model), sub(target), pairs, slope_weight)


search.loss = loss
