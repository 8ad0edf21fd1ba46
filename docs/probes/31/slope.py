"""Probe (31): the fluid's rate SNR with a slope in the SNR, so that its capacity can depend on the
transmit power (and distance) more or less than Shannon's at the true SNR: in dB,
``x + (SLOPE - 1) (x - PIVOT_DB)`` with ``x = snr_db + snr_offset_db`` (SLOPE 1: the product's).
The slope acts on ``x`` so that the fit, which folds the offset into the SNR input
(``calibrate.evaluate.model_kpis``), and a model with the offset in its config give the same rate.
Importing it patches ``radio.rate_snr_lin`` (read at call time by DiffFluid's inputs and the fluid
levels). SLOPE from the environment (or set ``slope.SLOPE[0]``)."""
import os

from isaac_net.core import radio

PIVOT_DB = 10.0  # about the middle of the fitted rate SNRs (offsets -8 .. -4 dB on 5 .. 35 dB), dB
SLOPE = [float(os.environ.get("SLOPE", "1"))]


def rate_snr_lin(snr_db, cfg):
    x = snr_db + cfg.snr_offset_db
    return radio.db_to_lin(x + (SLOPE[0] - 1.0) * (x - PIVOT_DB))


radio.rate_snr_lin = rate_snr_lin
