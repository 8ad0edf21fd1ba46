"""Calibration of the fluid models (L1D, QAD) to the packet level (L2-legacy).

L1D and QAD share L2-legacy's physics but not its effective capacity or latency: HARQ,
BLER, OLLA, MCS quantisation, per-subband PF and fading cost L2-legacy capacity, and the
SR/BSR timeline and grant delays give it a latency floor. Their gradients are then
gradients of another operating point. A calibration fits effective constants of
:class:`~isaac_net.core.config.CellConfig` per model (``mode``) and send relaxation (``sends``):

* ``rate_factor``: a capacity factor on the bytes a backlogged robot is served;
* ``snr_offset_db``: added to the SNR that sets the spectral efficiency (and QA's headroom
  cap); the transmit energy keeps the true power;
* the latency floor, ``l1_sr_slots`` for L1D and ``qa_sr_slots`` for QAD (``sr_slots`` here);
* for QAD, its power-headroom rule's per-subband SNR requirement ``qa_snr_req_db`` (from
  ``search["qa_snr_req_db"]``): L2-legacy splits the power over as many subbands as its buffer
  needs down to the lowest MCS's threshold, where QA's default of 15 dB keeps a calibrated QAD
  (SNR offset below 0) on one subband in the log regime of the spectral efficiency, with an
  energy that falls too little with power;
* the time on air's ``air_factor`` and crowd exponent ``air_crowd_exp`` (from
  ``search["air_crowd_exp"]``, fitted last): a robot's time on air is its band-rate time times
  ``air_factor n^air_crowd_exp``, n the robots backlogged in its cell, capped at the step, as
  L2-legacy's PF scheduler grants a robot of a busier cell fewer subbands per slot at full power;
  energy does not feed back, so their search evaluates the energy recorded from two rollouts
  (:class:`AirBasis`) and the constants found once by the model;

and, beside them, the relaxation temperature ``tau`` the model runs at (``Calibration.tau``,
chosen from ``search["tau"]``). The fluid has no variance: below saturation it delivers every
message, so its delivery and AoI slopes to size, power and distance are ~0 where L2-legacy's
(fading, HARQ, queue fluctuations) are not. A larger temperature smooths the completion, buffer
and deadline steps as a spread of service times would; its level is fitted like the constants,
on the training points' KPIs, never on the points the gradients are evaluated at.

The fit is forward-only and robust: with mean-field sends near critical load the KPI
gradients with respect to the constants reach 1e9, so a gradient-only fit diverges.
A coarse grid over the constants is evaluated in a few batched rollouts (the
candidates' capacity factor and SNR offset enter exactly through the inputs: bytes
``B / rate_factor`` and SNR ``snr_db + offset`` give the same service as the constants),
one grid per (latency floor, temperature[, SNR requirement]); then the best of them are refined
with Nelder-Mead on (log rate_factor, offset) with the constants themselves. The fitted
constants must give usable gradients: at every training point the rollout's autograd derivative
in p is checked against the model's own finite difference (:func:`check_gradients`); a choice whose
backpropagation through time explodes (a long latency floor with mean-field sends near critical
load; docs/design.md, "Measurements and history") is set aside and the next choice is refined.
The loss (:func:`loss`) has a level term, the mean over the points of the squared log error of
delay, AoI and energy (energy weighted by ``LOSS_WEIGHTS``) plus the delivery-ratio error in
units of 0.1, and a slope term, the same weighted squares of the errors' changes between
neighbouring points (along p, message size, power and fleet size; :func:`neighbours`), times
``SLOPE_WEIGHT``: the users of a calibration follow its slopes. It is fitted on a training grid
and reported on held-out points.

The effective constants depend on how many robots share a cell, and fitted at one size they lose
their fit at another (docs/design.md, "Calibration across fleet sizes"). :func:`fit_fleet` fits one
set of constants per fleet size, each on points loaded alike (:func:`scaled_points`), by
continuation from a reference size; the :class:`FleetCalibration` it gives interpolates them in
log R for the sizes between (``.at(R)``, ``.apply(cfg, R=R)``, ``.model(E, R)``). :func:`fit`
also takes several sizes at once (``R=(8, 12)``: one set of constants, the loss the mean over
every (fleet size, point)).

The package, one concern a module: ``targets`` (operating points, problems, the discrete level's
KPIs), ``loss`` (the target KPIs, their grouping and the loss), ``evaluate`` (the model's KPIs and
the gradient check), ``store`` (:class:`Calibration`, its file), ``search`` (:func:`fit`), ``fleet``
(:class:`FleetCalibration`, :func:`fit_fleet`).

Usage::

    from isaac_net.core.diff import calibrate
    cal = calibrate.fit("L1", "relaxed", grid=calibrate.product_grid([0.1, 0.4, 0.8], [6e3, 30e3], [23.0]),
                        R=8)
    net = DiffFluid(E, R, "cpu", mode="L1", tau=cal.tau, cfg=cal.apply(CellConfig()))  # as fitted
    cal.save("calibration.json")
    cal = calibrate.Calibration.load("calibration.json", mode="L1", sends="relaxed")
    net = cal.model(E, R)  # a file with several fleet sizes: the constants for R, interpolated
"""

from __future__ import annotations

from isaac_net.core.diff.calibrate.evaluate import (
    GRADIENT_H,
    GRADIENT_MAX_ERROR,
    KPI_FLOOR,
    AirBasis,
    check_gradients,
    model_kpis,
)
from isaac_net.core.diff.calibrate.fleet import (
    P_MAX,
    FleetCalibration,
    continuation_order,
    fit_fleet,
    fit_size,
    model_envs_for,
    scaled_points,
)
from isaac_net.core.diff.calibrate.loss import (
    DELIVERY_UNIT,
    LOSS_WEIGHTS,
    SLOPE_WEIGHT,
    TARGET_KPIS,
    group_kpis,
    loss,
    neighbours,
    point_loss,
)
from isaac_net.core.diff.calibrate.search import SEARCH, fit
from isaac_net.core.diff.calibrate.sizes import serving_sizes
from isaac_net.core.diff.calibrate.store import CALIBRATED_SENDS, FORMAT, VERSION, Calibration, save_all
from isaac_net.core.diff.calibrate.targets import (
    Problem,
    concat_points,
    fleet_sizes,
    measure,
    problem,
    product_grid,
)
from isaac_net.core.diff.model import mode_spec


def sr_field(mode: str) -> str:
    """The ``CellConfig`` field of the latency floor of ``mode``."""
    return mode_spec(mode).sr_field


__all__ = [
    "AirBasis",
    "CALIBRATED_SENDS",
    "DELIVERY_UNIT",
    "FORMAT",
    "GRADIENT_H",
    "GRADIENT_MAX_ERROR",
    "KPI_FLOOR",
    "LOSS_WEIGHTS",
    "SEARCH",
    "SLOPE_WEIGHT",
    "TARGET_KPIS",
    "VERSION",
    "Calibration",
    "FleetCalibration",
    "P_MAX",
    "Problem",
    "check_gradients",
    "concat_points",
    "continuation_order",
    "fit",
    "fit_fleet",
    "fit_size",
    "fleet_sizes",
    "group_kpis",
    "loss",
    "measure",
    "model_envs_for",
    "model_kpis",
    "neighbours",
    "point_loss",
    "problem",
    "product_grid",
    "save_all",
    "scaled_points",
    "serving_sizes",
    "sr_field",
]
