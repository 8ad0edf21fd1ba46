"""Cost of a rollout: wall time of the forward pass and of the backward pass of L1D and
QAD (eager and ``compile=True``), at each size and torch thread count, next to the
forward time of the discrete levels (L1, QA and, when it builds, L2-legacy) on the same
inputs.

Each measurement runs in a fresh process (``cost.py --measure SPEC``) with a time limit,
so that a slow ``torch.compile`` is recorded as timed out instead of holding the stage,
and so that its peak RSS (``resource.getrusage``) and, on CUDA, its peak allocated memory
are its own.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import time

import torch
from _common import REPO, draw_inputs, run
from tqdm import tqdm

DTYPES = {"float32": torch.float32, "float64": torch.float64}
WEIGHTS = {"mean_delay": 1.0, "mean_aoi": 0.5, "mean_energy_j": 50.0}  # the seed's quick-start loss
SCRIPT = REPO / "benchmarks" / "diff" / "cost.py"


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def relaxed(mode, E, R, T, tau, compile_, dtype, device, x, repeats) -> dict:
    from isaac_net.core.diff import DiffFluid, rollout

    fwd, bwd = [], []
    for _ in range(repeats + (1 if compile_ else 0)):
        # A fresh model per pass: a reset state would still link to the previous pass's graph.
        # torch.compile caches per process, so only the first pass compiles.
        net = DiffFluid(E, R, device, mode=mode, tau=tau, dtype=dtype, compile=compile_)
        leaf = {k: x[k].clone().requires_grad_(True) for k in ("p", "B", "tx", "pos")}
        _sync(device)
        t0 = time.perf_counter()
        k = rollout(net, T, leaf["p"], leaf["B"], pos=leaf["pos"], tx_dbm=leaf["tx"])
        loss = sum(w * k[name] for name, w in WEIGHTS.items())
        _sync(device)
        t1 = time.perf_counter()
        loss.backward()
        _sync(device)
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    out = {}
    if compile_:  # the first pass pays for compilation; report it apart
        out["first_forward_s"], out["first_backward_s"] = fwd.pop(0), bwd.pop(0)
    return {**out, "forward_s": min(fwd), "backward_s": min(bwd)}


def discrete(level, E, R, T, dtype, device, x, repeats, seed) -> dict:
    from isaac_net.core import make_engine

    times = []
    for _ in range(repeats):
        eng = make_engine(level, E, R, device, dtype=dtype, seed=seed)
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            for t in range(T):
                eng.step((x["u"][t] < x["p"]).to(dtype), x["B"], pos=x["pos"], tx_dbm=x["tx"])
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {"forward_s": min(times), "backward_s": None}


def measure(spec: dict) -> dict:
    """One measurement, in this process: ``spec`` holds kind, name, E, R, T, compile, threads,
    tau, dtype, device, repeats, seed."""
    torch.set_num_threads(spec["threads"])
    dev, dtype = spec["device"], DTYPES[spec["dtype"]]
    if torch.device(dev).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    E, R, T = spec["E"], spec["R"], spec["T"]
    x = draw_inputs(E, R, T, spec["sizes_bytes"], spec["seed"], p=spec["p"], tx_dbm=23.0, dtype=dtype,
                    device=dev)
    if spec["kind"] == "relaxed":
        r = relaxed(spec["name"], E, R, T, spec["tau"], spec["compile"], dtype, dev, x, spec["repeats"])
    else:
        r = discrete(spec["name"], E, R, T, dtype, dev, x, spec["repeats"], spec["seed"])
    r["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    is_cuda = torch.device(dev).type == "cuda"
    r["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20 if is_cuda else None
    return r


def measure_in_child(spec: dict, timeout_s: float) -> dict:
    """Run ``measure(spec)`` in a fresh process group, killed as a whole after ``timeout_s``
    (torch.compile starts worker processes of its own)."""
    cmd = [sys.executable, str(SCRIPT), "--measure", json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout_s:g} s"}
    if proc.returncode != 0:
        print(stderr, flush=True)
        last = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return {"error": last[-1] if last else f"exit status {proc.returncode}"}
    return json.loads(stdout.strip().splitlines()[-1])


def main(stage, params: dict, out: dict) -> None:
    """Wall time and memory of relaxed and discrete rollouts."""
    from isaac_net.core import CellConfig

    common = {"R": params["R"], "T": params["T"], "tau": float(params["tau"]), "dtype": params["dtype"],
              "p": params["p"], "sizes_bytes": params["sizes_bytes"], "device": stage.device,
              "repeats": params["repeats"], "seed": params["seed"]}
    jobs = [{"kind": "relaxed", "name": m, "E": E, "compile": c, "threads": th}
            for E in params["E"] for m in params["modes"] for c in params["compile"]
            for th in params["threads"]]
    levels = list(params["modes"]) + (["L2-legacy"] if params["l2_legacy"] else [])
    jobs += [{"kind": "discrete", "name": lv, "E": E, "compile": False, "threads": th}
             for E in params["E"] for lv in levels for th in params["threads"]]
    rows, unavailable = [], {}
    for job in tqdm(jobs, desc="cost", mininterval=2.0):
        if job["name"] in unavailable and job["kind"] == "discrete":
            continue
        r = measure_in_child({**common, **job}, params["timeout_s"])
        model = f"{job['name']}D" if job["kind"] == "relaxed" else job["name"]
        if "error" in r:
            where = f"E={job['E']} compile={job['compile']} threads={job['threads']}"
            print(f"[cost] {model} {where}: {r['error']}", flush=True)
            if job["kind"] == "discrete" and not r["error"].startswith("timed out"):
                unavailable[job["name"]] = r["error"]
                continue
        rows.append({"model": model, "E": job["E"], "R": common["R"], "T": common["T"],
                     "compile": job["compile"], "threads": job["threads"], **r,
                     "available": "error" not in r})
    summary = {
        "dtype": params["dtype"],
        "tau": common["tau"],
        "num_slots": CellConfig().num_slots,
        "peak_rss_mib": max((r["peak_rss_mib"] for r in rows if r["available"]), default=None),
        "l2_legacy_available": params["l2_legacy"] and "L2-legacy" not in unavailable,
        "compile_available": any(r["compile"] and r["available"] for r in rows),
        "num_failed": sum(not r["available"] for r in rows),
    }
    stage.write_json(out["json"], {"summary": summary, "table": rows, "unavailable": unavailable})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(json.loads(sys.argv[2]))))
    else:
        run(main, globals().get("snakemake"))
