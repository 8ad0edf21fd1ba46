"""Placement toy: move the robots (2-D positions, through the radio model) to improve the
network KPIs, at a stated movement cost, by gradient descent through the relaxed model
against the best of N random placements per env.

Cost per env: the KPI cost of ``opt_rates`` (delay, AoI, energy, delivery shortfall) plus

    move_weight * mean over robots of (sqrt(|pos - pos0|^2 + 1 m^2) - 1 m)

(a smoothed distance moved from the task position ``pos0``, in m; ``move_weight`` per m).
Send probability, message sizes and transmit power are fixed. Random candidates move each
robot uniformly within a disk of ``radius_m`` around its task position. The optimiser
machinery (annealing, scoring on the discrete level with held-out sends and on
L2-legacy) is ``_optimise``, shared with ``opt_rates``.
"""


import torch

try:
    from _common import run
    from _optimise import compute, write
except ImportError:  # imported as benchmarks.diff.placement (tests)
    from benchmarks.diff._common import run
    from benchmarks.diff._optimise import compute, write


class PlacementDecisions:
    """Robot positions ``[E, R, 2]`` m, unconstrained, starting at the task positions."""

    def __init__(self, sc: dict, params: dict):
        self.sc, self.params = sc, params
        self.E, self.R = sc["B"].shape
        dt, dev = sc["B"].dtype, sc["B"].device
        self.p = torch.full((self.E, self.R), float(params["p"]), dtype=dt, device=dev)
        self.tx = torch.full((self.E, self.R), float(params["tx_dbm"]), dtype=dt, device=dev)

    def init(self) -> dict:
        return {"pos": self.sc["pos"].clone().requires_grad_(True)}

    def __call__(self, theta: dict) -> dict:
        E = theta["pos"].shape[0]
        reps = E // self.E
        return {"p": self.p.repeat(reps, 1), "tx_dbm": self.tx.repeat(reps, 1),
                "B": self.sc["B"].repeat(reps, 1), "pos": theta["pos"]}

    def extra_cost(self, dec: dict) -> torch.Tensor:
        """``[E']`` movement cost (``E'`` a multiple of E: candidates are env-major repeats)."""
        reps = dec["pos"].shape[0] // self.E
        moved = dec["pos"] - self.sc["pos"].repeat(reps, 1, 1)
        dist = torch.sqrt((moved * moved).sum(-1) + 1.0) - 1.0
        return float(self.params["move_weight"]) * dist.mean(-1).to(torch.float64)

    def sample(self, n: int, gen: torch.Generator) -> dict:
        dt, E, R = self.sc["B"].dtype, self.E, self.R
        # Drawn on the CPU: the same candidates on every device.
        r = float(self.params["radius_m"]) * torch.sqrt(torch.rand(n * E, R, generator=gen, dtype=dt))
        a = 2 * torch.pi * torch.rand(n * E, R, generator=gen, dtype=dt)
        step = torch.stack([r * torch.cos(a), r * torch.sin(a)], -1).to(self.sc["pos"].device)
        pos = self.sc["pos"].repeat(n, 1, 1) + step
        return self({"pos": pos})


def compute_placement(params: dict, progress: bool = True, device: str = "cpu",
                      calibration=None, proxy_path: str | None = None) -> dict:
    payload = compute(params, PlacementDecisions, progress, device, calibration=calibration,
                      proxy_path=proxy_path)
    sc = payload["_sc"]
    moved = {}
    for name, sol in payload["_sols"].items():
        d0, d1 = sc["pos"].norm(dim=-1), sol["pos"].norm(dim=-1)
        moved[name] = {"mean_moved_m": float((sol["pos"] - sc["pos"]).norm(dim=-1).mean()),
                       "mean_gnb_distance_change_m": float((d1 - d0).mean())}
    payload["solutions_mean"] = moved
    payload["summary"]["move_weight_per_m"] = float(params["move_weight"])
    payload["summary"]["radius_m"] = float(params["radius_m"])
    return payload


def main(stage, params: dict, out: dict) -> None:
    """Robot placement against network KPIs plus a movement cost: gradients vs random search."""
    payload = compute_placement(params, device=stage.device, calibration=out.get("calibration"),
                                proxy_path=out.get("proxy"))
    write(stage, payload, out, "Robot placement (movement cost included), scored on L2-legacy")


if __name__ == "__main__":
    run(main, globals().get("snakemake"))
