"""Radio model: distance -> path loss -> SNR with the full power in one subband.

3GPP UMi street-canyon NLOS, simplified (docs/design.md §1):

.. math::
    d = \\max(\\lVert pos \\rVert, 1\\,\\mathrm{m}),\\quad
    PL = 22.4 + 35.3 \\log_{10} d + 21.3 \\log_{10} f_c,\\quad
    \\mathrm{snr} = P_{tx} - PL - N.

Everything is differentiable in ``pos`` and ``tx_dbm``; inside 1 m the clamp gives a
zero (and finite) gradient. Any finite position gives a finite SNR (where the squared norm
overflows the distance is taken in the log domain: :func:`log10_distance`).
"""

from __future__ import annotations

import math

import torch

from isaac_net.core.config import CellConfig


def distance_m(pos: torch.Tensor) -> torch.Tensor:
    """Distance to the gNB at the origin, clamped at 1 m.

    :input pos: ``[..., 2]`` positions, m.
    :output: ``[...]`` distance, m.
    """
    # Clamp the squared norm, not the norm: sqrt at 0 has an infinite derivative.
    return torch.sqrt(torch.clamp((pos * pos).sum(-1), min=1.0))


#: Scale of the positions whose squared norm overflows (2^-66: the squares of two float32 maxima
#: times it still add up finite).
_FAR_SCALE_LOG2 = 66


def log10_distance(pos: torch.Tensor) -> torch.Tensor:
    """``log10`` of :func:`distance_m`, finite for every finite position.

    Beyond ~1.8e19 m (float32; 1e154 m in float64) the squared norm overflows and the distance is
    inf; there the log is taken of the norm of the positions scaled by ``2^-66`` (exact) and the
    scale added back, so the path loss, and the SNR, stay finite (about -1000 dB at 1e30 m).

    :input pos: ``[..., 2]`` m. :output: ``[...]`` log10 of the distance in m.
    """
    sq = (pos * pos).sum(-1)
    plain = torch.log10(distance_m(pos))
    far = torch.isinf(sq)
    # Only the far positions enter the scaled branch (0 elsewhere, where its clamp has no gradient).
    pos_far = torch.where(far.unsqueeze(-1), pos, 0.0) * 2.0**-_FAR_SCALE_LOG2
    sq_far = torch.clamp((pos_far * pos_far).sum(-1), min=1.0)
    return torch.where(far, 0.5 * torch.log10(sq_far) + _FAR_SCALE_LOG2 * math.log10(2.0), plain)


def path_loss_db(pos: torch.Tensor, cfg: CellConfig) -> torch.Tensor:
    """Path loss, dB. :input pos: ``[..., 2]`` m (any finite value). :output: ``[...]`` dB, finite."""
    return 22.4 + 35.3 * log10_distance(pos) + 21.3 * math.log10(cfg.fc_ghz)


def snr_db(pos: torch.Tensor, tx_dbm: torch.Tensor | float, cfg: CellConfig) -> torch.Tensor:
    """SNR with the full transmit power in one subband, dB.

    :input pos: ``[..., 2]`` m. :input tx_dbm: broadcastable to ``[...]``, dBm.
    :output: ``[...]`` dB.
    """
    return tx_dbm - path_loss_db(pos, cfg) - cfg.noise_dbm


def rate_snr_lin(snr_db: torch.Tensor, cfg: CellConfig) -> torch.Tensor:
    """Linear SNR that sets the spectral efficiency of the fluid levels (L1, QA, L1D, QAD):
    ``snr_db`` plus the calibration's ``cfg.snr_offset_db``. The energy keeps the true power.

    :input snr_db: ``[...]`` dB. :output: ``[...]`` linear.
    """
    return db_to_lin(snr_db + cfg.snr_offset_db)


def db_to_lin(x_db: torch.Tensor) -> torch.Tensor:
    return torch.pow(10.0, x_db / 10.0)


def dbm_to_w(x_dbm: torch.Tensor) -> torch.Tensor:
    return torch.pow(10.0, (x_dbm - 30.0) / 10.0)
