"""Optimisation demo: per-robot send probability and transmit power by gradient descent
through the relaxed models (uncalibrated and calibrated to L2-legacy) and through the neural
proxy, scored on L2-legacy, against the start, the best of N random candidates per env
scored on L2-legacy itself, and the best uniform policy (one p and one power for all robots,
grid-searched on L2-legacy).

Cost per env (lower is better), the same on every model:

    cost = mean_delay + w_aoi * mean_aoi + w_energy * mean_energy_j
           + penalty * max(delivery_min - delivery_ratio, 0)

(the KPIs of the env's robots: delay and delivery totals over totals, AoI and energy
means; delay and AoI in control steps, energy in J per robot per step).

Gradient: Adam on unconstrained parameters (``p = lo + (hi - lo) sigmoid(theta)``, same
for tx power) through each model of ``models`` (``mode``, ``sends``, with or without its
calibration; relaxed-Bernoulli sends with fresh uniforms each iteration, ``tau`` annealed
geometrically from ``tau_start`` to ``tau_end``, a calibrated model's not below its fitted
``Calibration.tau``) and, with ``proxy``, through the neural
proxy's per-robot KPIs (no sends: the proxy predicts expectations). Random search:
``candidates`` uniform draws of the decisions per env, each scored on ``level`` with the
training sends; the best per env is kept. Uniform policy: every (p, tx) of ``uniform`` for
all robots of all envs, scored on ``level`` with the training sends; the best mean cost is
kept. Every solution (and the start) is scored on ``level`` with held-out sends (other
uniforms, another engine seed).
"""

import torch

try:
    from _common import run
    from _optimise import bounded, compute, unbounded, write
except ImportError:  # imported as benchmarks.diff.opt_rates (tests)
    from benchmarks.diff._common import run
    from benchmarks.diff._optimise import bounded, compute, unbounded, write


class RateDecisions:
    """Per-robot send probability and transmit power, bounded by sigmoids."""

    def __init__(self, sc: dict, params: dict):
        self.sc, self.b = sc, params["bounds"]
        self.params = params
        E, R = sc["B"].shape
        self.E, self.R = E, R

    def init(self) -> dict:
        b, dt, dev = self.b, self.sc["B"].dtype, self.sc["B"].device
        p0 = unbounded(float(self.params["p_init"]), *b["p"])
        t0 = unbounded(float(self.params["tx_init_dbm"]), *b["tx_dbm"])
        return {"p": torch.full((self.E, self.R), p0, dtype=dt, device=dev, requires_grad=True),
                "tx": torch.full((self.E, self.R), t0, dtype=dt, device=dev, requires_grad=True)}

    def __call__(self, theta: dict) -> dict:
        return {"p": bounded(theta["p"], *self.b["p"]), "tx_dbm": bounded(theta["tx"], *self.b["tx_dbm"]),
                "B": self.sc["B"], "pos": self.sc["pos"]}

    def extra_cost(self, dec: dict) -> torch.Tensor:
        return torch.zeros(dec["p"].shape[0], dtype=torch.float64, device=dec["p"].device)

    def sample(self, n: int, gen: torch.Generator) -> dict:
        b, dt, E, R = self.b, self.sc["B"].dtype, self.E, self.R
        dev = self.sc["B"].device

        def uni(lo, hi):  # drawn on the CPU: the same candidates on every device
            return (lo + (hi - lo) * torch.rand(n * E, R, generator=gen, dtype=dt)).to(dev)

        return {"p": uni(*b["p"]), "tx_dbm": uni(*b["tx_dbm"]), "B": self.sc["B"].repeat(n, 1),
                "pos": self.sc["pos"].repeat(n, 1, 1)}

    def uniform(self, policies) -> dict:
        """Decisions of the uniform policies ``[(p, tx_dbm)]``: one p and one power for every robot
        of every env, envs repeated per policy (policy-major)."""
        dt, dev, E, R = self.sc["B"].dtype, self.sc["B"].device, self.E, self.R
        pol = torch.tensor(policies, dtype=dt, device=dev).repeat_interleave(E, 0)  # [n E, 2]
        n = len(policies)
        return {"p": pol[:, :1].expand(n * E, R).contiguous(),
                "tx_dbm": pol[:, 1:].expand(n * E, R).contiguous(),
                "B": self.sc["B"].repeat(n, 1), "pos": self.sc["pos"].repeat(n, 1, 1)}


def main(stage, params: dict, out: dict) -> None:
    """Per-robot send probability and transmit power: gradients through the models vs the baselines."""
    payload = compute(params, RateDecisions, device=stage.device, calibration=out.get("calibration"),
                      proxy_path=out.get("proxy"))
    write(stage, payload, out, "Send probability and tx power, scored on L2-legacy")


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
