"""QAD with mean-field sends' backlog closure at low temperature (docs/design.md, section 6): autograd
against central differences over a rollout, float64, and the step's Jacobian on a cell that fails.

    python docs/probes/closure_tau/closure_tau.py plain T TAUS       # 16 random cells, closure on and off
    python docs/probes/closure_tau/closure_tau.py calibrated T TAUS N  # the committed QAD mean-field
    python docs/probes/closure_tau/closure_tau.py hsweep SEED TAU      # the difference's half step
    python docs/probes/closure_tau/closure_tau.py jacobian SEED TAU    # the step's spectral radius
    python docs/probes/closure_tau/closure_tau.py perturb TAU          # the gradient's change with p
    python docs/probes/closure_tau/closure_tau.py mechanism SEEDS TAUS # what expands: the own chance

The derivative is that of ``mean_aoi + mean_delay + 10 delivery_ratio`` in a common relative shift of
every robot's p (a cell's p kept below 0.9 so that the shift never meets the clamp at 1). The
calibrated cells read ``benchmarks/diff/results/full/calibration.json`` (run from the repository).
"""

import functools
import math
import statistics
import sys
import warnings

import torch

from isaac_net.core.config import CellConfig
from isaac_net.core.diff import calibrate, relax
from isaac_net.core.diff.model import DiffFluid, _step
from isaac_net.core.diff.rollout import rollout

warnings.filterwarnings("ignore")  # DiffFluid's warning below CLOSURE_MIN_TAU: this probe measures why
torch.set_num_threads(1)
F64 = torch.float64
CLOSED = CellConfig(mf_backlog_closure=True)


def plain_cell(seed):
    """As ``tests/test_reliability.py``'s ``_closure_cell``: 1-64 robots, p up to 12 / R, 0-40 dB."""
    g = torch.Generator().manual_seed(seed)
    R = int(torch.randint(1, 65, (1,), generator=g))
    p = torch.rand(2, R, generator=g, dtype=F64) * float(torch.rand(1, generator=g)) * min(1.0, 12.0 / R)
    snr = torch.rand(2, R, generator=g, dtype=F64) * 40.0
    return dict(p=p.clamp(max=0.9), snr_db=snr, B=float(torch.rand(1, generator=g)) * 3e4 + 2000.0)


def calibrated_cell(seed, fc):
    """R of 4-64 robots at 40-140 m, R p of 1-12 (light to past the knee), 4-30 kB, the committed
    constants for that R."""
    g = torch.Generator().manual_seed(1000 + seed)
    R = int(torch.randint(4, 65, (1,), generator=g))
    load = float(torch.rand(1, generator=g)) * 11.0 + 1.0
    p = (torch.rand(2, R, generator=g, dtype=F64) * 0.5 + 0.75) * load / R
    pos = torch.rand(2, R, 2, generator=g, dtype=F64) * 100.0 + 40.0
    B = float(torch.rand(1, generator=g)) * 26e3 + 4000.0
    return dict(p=p.clamp(max=0.9), pos=pos, B=B, cfg=fc.at(R).apply(R=R))


def loss(cell, tau, T, shift, cfg):
    p = cell["p"] * (1.0 + shift)
    net = DiffFluid(*p.shape, mode="QA", tau=tau, cfg=cell.get("cfg", cfg), dtype=F64)
    k = rollout(net, T, p, cell["B"], snr_db=cell.get("snr_db"), pos=cell.get("pos"), sends="mean_field",
                warmup=10 if "pos" in cell else 0)
    return k["mean_aoi"] + k["mean_delay"] + 10.0 * k["delivery_ratio"]


def ad_fd(cell, tau, T, cfg=CLOSED, hs=(1e-5,)):
    shift = torch.zeros((), dtype=F64, requires_grad=True)
    (ad,) = torch.autograd.grad(loss(cell, tau, T, shift, cfg), shift)
    with torch.no_grad():
        fds = [float(loss(cell, tau, T, torch.tensor(h, dtype=F64), cfg)
                     - loss(cell, tau, T, torch.tensor(-h, dtype=F64), cfg)) / (2.0 * h) for h in hs]
    return float(ad), fds


def report(label, cells, tau, T, cfg=CLOSED):
    errs = []
    for seed, cell in cells:
        ad, (fd,) = ad_fd(cell, tau, T, cfg)
        errs.append((abs(ad - fd) / (abs(fd) + 1e-3), seed, cell["p"].shape[1]))
    e = [v for v, _, _ in errs]
    bad = [(s, R, f"{v:.1e}") for v, s, R in errs if v > 0.05]
    print(f"{label} T {T} tau {tau}: |AD - FD| / |FD| median {statistics.median(e):.1e} max {max(e):.1e}; "
          f"above 5 %: {len(bad)}/{len(errs)} (seed, R, error) {bad}", flush=True)


def step_map(seed, tau):
    """Env 0 of cell ``seed`` with the closure at ``tau``, as a map of its state: ``(R, A, state,
    args, flat, f)``, ``state`` the empty ``(x, w, aoi)``, ``args`` the rest of ``model._step``'s,
    ``flat(x, w)`` env 0's bytes (in units of the message) and mass as one vector ``[2 R A]``, and
    ``f(v, x, w, aoi)`` the next step's ``flat`` from ``v`` in env 0 (the other env as in ``x``, ``w``)."""
    cell = plain_cell(seed)
    E, R = cell["p"].shape
    net = DiffFluid(E, R, mode="QA", tau=tau, dtype=F64, cfg=CLOSED)
    inp = net.inputs(cell["B"], snr_db=cell["snr_db"])
    state = (net.state.x.clone(), net.state.w.clone(), net.state.aoi.clone())
    A = state[0].shape[-1]
    args = (cell["p"], inp.msg_bytes, inp.snr_lin, inp.tx_w, inp.keep, inp.headroom, tau, net.tau_n, CLOSED,
            "QA")

    def flat(x, w):
        return torch.cat([x[0].reshape(-1) / cell["B"], w[0].reshape(-1)])

    def f(v, x, w, aoi):
        xx, ww = x.clone(), w.clone()
        xx[0], ww[0] = v[: R * A].view(R, A) * cell["B"], v[R * A:].view(R, A)
        out = _step(xx, ww, aoi, *args)
        return flat(out.x, out.w)

    return R, A, state, args, flat, f


def step_jacobian(f, flat, x, w, aoi):
    """The Jacobian ``[2 R A, 2 R A]`` of ``step_map``'s ``f`` at the state ``(x, w, aoi)``."""
    return torch.autograd.functional.jacobian(functools.partial(f, x=x, w=w, aoi=aoi), flat(x, w))


def jacobian(seed, tau, steps=40):
    """The spectral radius of one step's map of env 0's state (bytes in units of the message, and
    mass), along the rollout, and the leading mode's largest components at the last step."""
    R, A, (x, w, aoi), args, flat, f = step_map(seed, tau)
    for t in range(steps):
        J = step_jacobian(f, flat, x, w, aoi)
        vals, vecs = torch.linalg.eig(J)
        i = int(vals.abs().argmax())
        print(f"step {t:2d}: spectral radius {float(vals.abs()[i]):.3f} (eigenvalue {complex(vals[i]):.3f}), "
              f"mass per robot mean {float(w[0].sum(-1).mean()):.2e}", flush=True)
        out = _step(x, w, aoi, *args)
        if t < steps - 1:
            x, w, aoi = out.x, out.w, out.aoi
    for k, idx in zip(*torch.topk(vecs[:, i].abs(), 4), strict=True):
        part, j = ("bytes", int(idx)) if idx < R * A else ("mass", int(idx) - R * A)
        print(f"  leading mode: {part} of robot {j // A}, age {j % A}: {float(k):.3f} "
              f"(bytes left {float(x[0].reshape(-1)[j]):.3g} of a mass {float(w[0].reshape(-1)[j]):.3g})")


def _own_chance_detached(mass, *, deriv=True):
    """``relax.backlog_closure`` whose ``busy`` (the factor of a robot's own service) is a constant of
    the step, its ``n`` (the others' chances) still live: the Jacobian without the own-chance path."""
    busy, n, d_busy = _BACKLOG_CLOSURE(mass, deriv=deriv)
    return busy.detach(), n, d_busy


_BACKLOG_CLOSURE = relax.backlog_closure


def mechanism(seed, tau, steps=30):
    """Along the rollout of env 0 of cell ``seed``: how much a perturbation of the state (bytes and mass
    at every robot and age) can grow over ``steps`` steps, with the closure as it is and with each
    robot's own chance in its service detached (``_own_chance_detached``: n, the others' chances, still
    live), and on which robot the most grown perturbation ends."""
    R, A, (x, w, aoi), args, flat, f = step_map(seed, tau)

    # the tangent map over the rollout, P = J_t ... J_1, with the closure as it is and with the own
    # chance detached; its largest singular value is how much a perturbation of the state can grow
    n = 2 * R * A
    P, P_own = torch.eye(n, dtype=F64), torch.eye(n, dtype=F64)
    log_p = log_own = 0.0
    for _ in range(steps):
        P = step_jacobian(f, flat, x, w, aoi) @ P
        relax.backlog_closure = _own_chance_detached
        try:
            P_own = step_jacobian(f, flat, x, w, aoi) @ P_own
        finally:
            relax.backlog_closure = _BACKLOG_CLOSURE
        for k, M in enumerate((P, P_own)):  # rescale, keeping the log of the scale
            s_max = float(torch.linalg.matrix_norm(M, ord=2))
            M /= s_max
            if k == 0:
                log_p += math.log10(s_max)
            else:
                log_own += math.log10(s_max)
        out = _step(x, w, aoi, *args)
        x, w, aoi = out.x, out.w, out.aoi
    u = torch.linalg.svd(P).U[:, 0] ** 2  # where the most grown perturbation ends: robot by robot
    per_robot = u[: R * A].view(R, A).sum(-1) + u[R * A:].view(R, A).sum(-1)
    j = int(per_robot.argmax())
    print(f"seed {seed} R {R} tau {tau}, {steps} steps: log10 of the tangent map's largest singular value "
          f"{log_p:+.1f} (each robot's own chance in its service detached: {log_own:+.1f}); the most grown "
          f"perturbation ends {float(per_robot[j]):.3f} on robot {j}", flush=True)


def perturb(tau):
    """On 20 cells (E = 2, 1-32 robots, p uniform, 0-40 dB, T = 20): the float64 gradient in p's
    relative change when p moves by 1e-7 of itself (float32's rounding of p), closure on and off."""
    for closure in (True, False):
        rel = []
        for seed in range(20):
            g = torch.Generator().manual_seed(seed)
            R = int(torch.randint(1, 33, (1,), generator=g))
            p0 = torch.rand(2, R, generator=g, dtype=F64)
            snr = torch.rand(2, R, generator=g, dtype=F64) * 40.0
            B = float(torch.rand(1, generator=g)) * 3e4 + 2000.0
            grads = []
            for eps in (0.0, 1e-7):
                p = (p0 * (1.0 + eps)).clamp(0.0, 1.0).requires_grad_()
                net = DiffFluid(2, R, mode="QA", tau=tau, dtype=F64, cfg=CLOSED if closure else CellConfig())
                k = rollout(net, 20, p, B, snr_db=snr, sends="mean_field")
                (gp,) = torch.autograd.grad(k["mean_aoi"] + k["mean_delay"] + 10.0 * k["delivery_ratio"], p)
                grads.append(gp)
            rel.append(float((grads[1] - grads[0]).norm() / grads[0].norm()))
        print(f"closure {closure} tau {tau}: the gradient's relative change median "
              f"{statistics.median(rel):.2e}, at most {max(rel):.2e}", flush=True)


def main():
    what = sys.argv[1]
    if what == "plain":
        T, taus = int(sys.argv[2]), [float(v) for v in sys.argv[3].split(",")]
        cells = [(s, plain_cell(s)) for s in range(16)]
        for closure in (True, False):
            for tau in taus:
                report(f"closure {closure}", cells, tau, T, CLOSED if closure else CellConfig())
    elif what == "calibrated":
        T, taus, n = int(sys.argv[2]), [float(v) for v in sys.argv[3].split(",")], int(sys.argv[4])
        fc = calibrate.Calibration.load("benchmarks/diff/results/full/calibration.json", mode="QA",
                                        sends="mean_field")
        cells = [(s, calibrated_cell(s, fc)) for s in range(n)]
        for tau in taus:
            report("calibrated QAD mean-field", cells, tau, T)
    elif what == "hsweep":
        seed, tau = int(sys.argv[2]), float(sys.argv[3])
        hs = (1e-4, 1e-5, 1e-6, 1e-7)
        ad, fds = ad_fd(plain_cell(seed), tau, 60, hs=hs)
        print(f"seed {seed} tau {tau}: autograd {ad:+.4e}; central differences "
              + ", ".join(f"h {h:.0e}: {v:+.4e}" for h, v in zip(hs, fds, strict=True)))
    elif what == "perturb":
        perturb(float(sys.argv[2]))
    elif what == "jacobian":
        jacobian(int(sys.argv[2]), float(sys.argv[3]))
    elif what == "mechanism":
        for tau in [float(v) for v in sys.argv[3].split(",")]:
            for seed in [int(v) for v in sys.argv[2].split(",")]:
                mechanism(seed, tau)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
