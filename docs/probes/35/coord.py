"""Probe (35), the interpolation's coordinate: the training loss at a fitted size R = 8, 16, 32 of the
constants interpolated between its two neighbouring fits (the size itself left out, as ``size_losses``'
``between``) with the weight of log R (committed), of R and of 1 / R. Training points and targets only.

Usage: python docs/probes/35/coord.py MODE SENDS
"""

import dataclasses
import json
import math
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import joint as J  # noqa: E402  (the probe's sizes and loss)

from isaac_net.core.diff import calibrate  # noqa: E402
from isaac_net.core.diff.calibrate.fleet import _interpolated  # noqa: E402

COORDS = {"log R": math.log, "R": float, "1 / R": lambda r: -1.0 / r}


def at_coord(lo, hi, R, coord):
    """``_interpolated(lo, hi, R)``'s constants with the weight of ``coord`` instead of log R's."""
    f = COORDS[coord]
    w = (f(R) - f(lo.R[0])) / (f(hi.R[0]) - f(lo.R[0]))
    c = _interpolated(lo, hi, R)
    if coord == "log R":
        return w, c

    def lin(a, b):
        return (1.0 - w) * a + w * b

    def geo(a, b):
        return math.exp(lin(math.log(a), math.log(b)))

    return w, dataclasses.replace(
        c, rate_factor=geo(lo.rate_factor, hi.rate_factor),
        snr_offset_db=lin(lo.snr_offset_db, hi.snr_offset_db),
        sr_slots=int(round(lin(lo.sr_slots, hi.sr_slots))), tau=geo(lo.tau, hi.tau),
        qa_snr_req_db=None if c.qa_snr_req_db is None else lin(lo.qa_snr_req_db, hi.qa_snr_req_db),
        air_factor=geo(lo.air_factor, hi.air_factor), air_crowd_exp=lin(lo.air_crowd_exp, hi.air_crowd_exp),
        load_spread=lin(lo.load_spread, hi.load_spread))


def main():
    mode, sends = sys.argv[1], sys.argv[2]
    fc = calibrate.Calibration.load(f"{J.RES}/fit_{mode}_{sends}.json", mode=mode, sends=sends)
    out = {"mode": mode, "sends": sends}
    for i in range(1, len(fc.fits) - 1):
        R = fc.R[i]
        size = J.Size(mode, sends, R, fc.at(R).load_spread)
        for coord in COORDS:
            w, c = at_coord(fc.fits[i - 1], fc.fits[i + 1], R, coord)
            out[f"{R} {coord}"] = (round(w, 3), size.loss(c))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
