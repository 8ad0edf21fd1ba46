"""pytest-benchmark suite of the speed targets (issue "Speed and scale"), one CPU thread.

Run with ``make bench`` (``pytest benchmarks/perf --benchmark-only``). Benchmarks, not
timed tests: each records its target in ``extra_info`` and nothing fails when a shared
machine is slow. Compare the eager and compiled rows of one run as ratios.

``ISAAC_BENCH_DEVICE=cuda`` runs the same workloads on the GPU (float32; each timed call
ends with a device synchronisation), with the discrete levels also as ``backend="cuda_graph"``.
"""

from __future__ import annotations

import os
import resource

import pytest
import torch

from isaac_net.core import make_engine
from isaac_net.core.config import CellConfig
from isaac_net.core.diff import DiffFluid, rollout
from isaac_net.core.diff.reference import discrete_rollout

R = 8
DEVICE = os.environ.get("ISAAC_BENCH_DEVICE", "cpu")


def _sync():
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def _problem(E, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.full((E, R), 0.4)
    B = torch.where(torch.rand(E, R, generator=g) < 0.5, 4000.0, 30_000.0)
    tx = torch.full((E, R), 23.0)
    pos = 40 + 100 * torch.rand(E, R, 2, generator=g)
    return tuple(x.to(DEVICE).requires_grad_() for x in (p, B, tx, pos))


def _fwd_bwd(net, T, p, B, tx, pos):
    net.reset()
    net.detach()
    k = rollout(net, T, p, B, pos=pos, tx_dbm=tx)
    (k["mean_delay"] + 0.5 * k["mean_aoi"] + 50.0 * k["mean_energy_j"]).backward()
    _sync()
    return k


def _info(benchmark, **kw):
    benchmark.extra_info.update(
        device=DEVICE, torch_threads=torch.get_num_threads(), load_avg_1min=os.getloadavg()[0],
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, torch=torch.__version__, **kw,
    )


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.mark.benchmark(group="L1D E=16 T=60 fwd+bwd")
@pytest.mark.parametrize("variant", ["per-slot-autograd", "eager", "eager-checkpoint", "compiled"])
def test_l1d_e16(benchmark, variant):
    """The bar: compiled under a tenth of per-slot autograd (the baseline design) and 0.1 s."""
    args = _problem(16)
    net = DiffFluid(16, R, DEVICE, mode="L1", tau=0.05, compile=variant == "compiled",
                    checkpoint=variant == "eager-checkpoint" or None)
    if variant == "per-slot-autograd":
        net.slot_grad = "autograd"
    _fwd_bwd(net, 60, *args)  # warm-up (compilation)
    benchmark.pedantic(_fwd_bwd, args=(net, 60, *args), rounds=3, iterations=1)
    _info(benchmark, slots=net.slot_grad, target_s={"compiled": 0.1, "eager": 1.0}.get(variant))


@pytest.mark.benchmark(group="L1D E=64 T=60 fwd+bwd")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_l1d_e64(benchmark, compiled):
    args = _problem(64)
    net = DiffFluid(64, R, DEVICE, mode="L1", tau=0.05, compile=compiled)
    _fwd_bwd(net, 60, *args)
    benchmark.pedantic(_fwd_bwd, args=(net, 60, *args), rounds=3, iterations=1)
    _info(benchmark, slots=net.slot_grad, target_s=0.3 if compiled else None)


@pytest.mark.benchmark(group="QAD E=64 T=60 fwd+bwd")
@pytest.mark.parametrize("variant", ["autograd", "eager", "compiled"])
def test_qad_e64(benchmark, variant):
    """``eager`` is the fused step node (the default); ``autograd``, autograd through every op of the step."""
    args = _problem(64)
    net = DiffFluid(64, R, DEVICE, mode="QA", tau=0.05, compile=variant == "compiled")
    if variant == "autograd":
        net.slot_grad = "autograd"
    _fwd_bwd(net, 60, *args)
    benchmark.pedantic(_fwd_bwd, args=(net, 60, *args), rounds=3, iterations=1)
    _info(benchmark, target_s=0.05 if variant == "eager" else None)


@pytest.mark.benchmark(group="QAD backlog closure E=64 T=60 fwd+bwd")
@pytest.mark.parametrize("variant", ["autograd", "eager", "compiled"])
def test_qad_closure_e64(benchmark, variant):
    """QAD with mean-field sends' backlog closure and a calibrated time on air (the rules of the
    calibrated QAD mean-field cell): ``eager`` the fused step node; ``autograd``, autograd through every op
    of the step, which such a cell ran before the node had the closure."""
    args = _problem(64)
    cfg = CellConfig(mf_backlog_closure=True, air_factor=1.5, air_crowd_exp=0.5)
    net = DiffFluid(64, R, DEVICE, mode="QA", tau=0.05, cfg=cfg, compile=variant == "compiled")
    if variant == "autograd":
        net.slot_grad = "autograd"
    _fwd_bwd(net, 60, *args)
    benchmark.pedantic(_fwd_bwd, args=(net, 60, *args), rounds=3, iterations=1)
    _info(benchmark)


def _discrete(level, T, p, B, **kw):
    out = discrete_rollout(level, T, p, B, **kw)
    _sync()
    return out


@pytest.mark.benchmark(group="discrete E=64 T=200")
@pytest.mark.parametrize("backend", ["eager", "cuda_graph"])
@pytest.mark.parametrize("level", ["L1", "QA"])
def test_discrete(benchmark, level, backend):
    if backend == "cuda_graph" and DEVICE == "cpu":
        pytest.skip("backend cuda_graph: CUDA only (ISAAC_BENCH_DEVICE=cuda)")
    p, B, tx, pos = (x.detach() for x in _problem(64))
    engine = make_engine(level, 64, R, DEVICE, dtype=torch.float32, backend=backend)
    u = torch.rand(200, 64, R, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    kw = dict(pos=pos, tx_dbm=tx, u=u, engine=engine)
    _discrete(level, 200, p, B, **kw)  # warm-up (capture, for cuda_graph)
    benchmark.pedantic(_discrete, args=(level, 200, p, B), kwargs=kw, rounds=3, iterations=1)
    _info(benchmark, target_s=1.0, backend=backend)


@pytest.mark.benchmark(group="L1D E=1024 T=200 fwd+bwd")
def test_l1d_e1024_memory(benchmark):
    args = _problem(1024)
    net = DiffFluid(1024, R, DEVICE, mode="L1", tau=0.05)  # eager; the default checkpoints the slot loop here
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    benchmark.pedantic(_fwd_bwd, args=(net, 200, *args), rounds=1, iterations=1, warmup_rounds=1)
    _info(benchmark, target_peak_gb=8.0, slots=net.slot_grad,
          peak_cuda_mb=torch.cuda.max_memory_allocated() / 2**20 if DEVICE != "cpu" else None,
          peak_rss_growth_mb=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024)
