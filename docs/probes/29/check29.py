"""Probe (29) checks: the pooled interval (pool.py) against (a) the product's re-shared interval at
a = 1 (both are probe (19)'s rule there), (b) QA's static share as a -> 0, (c) an event-by-event
simulation of the pool at tau = 0 (each robot's drain time)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np, torch
torch.set_num_threads(1)
from isaac_net.core.config import CellConfig
from isaac_net.core.diff import calibrate, model
product = model._reshared_qa
import pool  # patches model._reshared_qa

prob = calibrate.problem([(0.3, 8e3, 23.0), (0.6, 2e4, 23.0), (0.9, 3e4, 10.0)], R=8, envs=2, T=20,
                         warmup=4, seed=0, dtype=torch.float64)


def kpis(a, tau, rule):
    model._reshared_qa = rule
    try:
        return calibrate.model_kpis("QA", "relaxed", prob, CellConfig(qa_sr_slots=8, qa_reshare=a), tau=tau, lam=0.1)
    finally:
        model._reshared_qa = pool.pooled_qa


def rel(x, y):
    return max(float((x[k] - y[k]).abs().max() / y[k].abs().max().clamp(min=1e-30)) for k in y)


for tau in (0.1, 0.0):
    print(f"tau {tau}: a = 1 pool vs product {rel(kpis(1.0, tau, pool.pooled_qa), kpis(1.0, tau, product)):.2e}; "
          f"a = 1e-9 pool vs static {rel(kpis(1e-9, tau, pool.pooled_qa), kpis(0.0, tau, product)):.2e}; "
          f"a = 0.5 pool vs product (differ) {rel(kpis(0.5, tau, pool.pooled_qa), kpis(0.5, tau, product)):.2e}")


def simulate(Ve, Vl, s, T, a, n):
    """Event by event: early needs Ve from t = 0, late needs Vl from the SR's end s; each robot being
    served gains level at (1 - a) + a n / n'. Returns each robot's drain time (inf past T)."""
    need = np.concatenate([Ve, Vl]); start_t = np.r_[np.zeros(len(Ve)), np.full(len(Vl), s)]
    got = np.zeros(len(need)); done = np.full(len(need), np.inf); t = 0.0
    while t < T - 1e-15:
        act = (start_t <= t + 1e-15) & (got < need - 1e-15)
        nxt = [T] + ([s] if t < s else [])
        if act.any():
            r = (1 - a) + a * n / act.sum()
            nxt.append(t + ((need - got)[act]).min() / r)
        t1 = min(nxt)
        if act.any():
            got[act] += (t1 - t) * r
            for i in np.where(act & (got >= need - 1e-12))[0]:
                done[i] = t1
        t = t1
    return done


rng = np.random.default_rng(1)
worst = 0.0
for case in range(300):
    ne, nl = rng.integers(0, 6), rng.integers(0, 6)
    if ne + nl == 0:
        continue
    n = ne + nl + rng.integers(0, 3)  # robots counted in the static divisor
    a, s, T = rng.uniform(0.05, 1.0), rng.uniform(0.0, 0.5), 1.0
    Ve, Vl = rng.uniform(0.0, 0.6, ne), rng.uniform(0.0, 0.6, nl)
    ref = simulate(Ve, Vl, s, T, a, n)
    f = lambda v: torch.tensor(v, dtype=torch.float64)[None]
    sn = torch.tensor([[float(n)]], dtype=torch.float64)
    Vb = f(np.r_[Ve, Vl]); e = f(np.r_[np.zeros(ne), np.ones(nl)]); early = 1 - e
    g_tail = torch.full_like(sn, 1.0 - a)
    ev1, t1, g1 = pool._time_map(torch.zeros_like(Vb), Vb, early, a, sn, g_tail)
    L_s = pool._level_at(torch.full_like(sn, s), ev1, t1, g1, g_tail)
    ev, t, g = pool._time_map(torch.cat([torch.zeros_like(Vb), L_s.expand_as(Vb)], -1), torch.cat([Vb, L_s + Vb], -1),
                                   torch.cat([early, e], -1), a, sn, g_tail)
    mine = pool._time_at(e * L_s + Vb, ev, t, g, g_tail)[0].numpy()
    ok = ref <= T
    worst = max(worst, float(np.abs(mine[ok] - ref[ok]).max(initial=0.0)))
    L = pool._level_at(torch.full_like(sn, T), ev, t, g, g_tail)
    assert np.all((e * L_s + Vb)[0].numpy()[~ok] >= float(L) - 1e-12), case  # not done by T: need past the end level
print(f"event simulation, 300 random cases: worst drain-time error {worst:.2e} s")

# (d) the service's derivatives against central differences in float64, at robots with bytes queued
# (at an empty robot's mass 0 a central step leaves the domain)
torch.manual_seed(3)
E, R, A = 2, 5, 4
x0 = torch.rand(E, R, A, dtype=torch.float64) * 8e3 * (torch.rand(E, R, 1, dtype=torch.float64) > 0.3)
mass = (x0 > 0).double().sum(-1) * (torch.rand(E, R, dtype=torch.float64) > 0.4)
snr, head, w0 = torch.rand(E, R, dtype=torch.float64) * 100 + 1, torch.full((E, R), 8.0, dtype=torch.float64), (x0 > 0) * 0.9
for a in (0.3, 0.8):
    cfg = CellConfig(qa_sr_slots=8, qa_reshare=a)

    def f(x, w):
        out = model._service_qa(x, w, mass, snr, head, cfg, 0.1)
        return torch.cat([out[0].reshape(-1), out[1].reshape(-1), out[2].reshape(-1) / 1e4, out[4].reshape(-1) / 1e4])

    J = torch.autograd.functional.jacobian(f, (x0, w0.double()))
    worst = 0.0
    for i, inp in enumerate((x0, w0.double())):
        for j in torch.nonzero((x0 > 0).reshape(-1)).flatten().tolist():
            h = 1e-6 * max(1.0, abs(float(inp.reshape(-1)[j])))
            args = [[x0.clone(), w0.double().clone()] for _ in range(2)]
            args[0][i].view(-1)[j] += h
            args[1][i].view(-1)[j] -= h
            num = (f(*args[0]) - f(*args[1])) / (2 * h)
            worst = max(worst, float((num - J[i].reshape(num.shape[0], -1)[:, j]).abs().max()))
    print(f"a = {a}: derivatives against central differences, worst absolute error {worst:.1e}")
