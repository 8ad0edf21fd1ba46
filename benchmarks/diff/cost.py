"""Cost of a rollout: wall time of the forward pass and of the backward pass of L1D and
QAD (eager and ``compile=True``), at each size and torch thread count, next to the
forward time of the discrete levels (L1, QA and, when it builds, L2-legacy) on the same
inputs; autograd through every slot of L1D (no fused node) as the baseline of the speed-up;
the first compiled call of each model with an empty and with a warm inductor cache; one large
L1D rollout for memory; the same on CUDA when a device is visible; and the ratio to reference
times of the same workloads given in the config (``earlier_s``). L2-legacy's slot loops, eager
torch ops against the numba kernel (the CPU's default), side by side at more batch sizes on one
thread, and the numba kernel's first call with an empty and with a warm numba cache
(``NUMBA_CACHE_DIR`` of this stage's own).

Every child process compiles into an inductor cache directory of this stage's own (one per
model, created empty), so the "cold cache" rows are cold on any machine and the rest do not
depend on what the user's cache holds. Inductor keeps one thing outside that directory: its
precompiled C++ header, built once per machine, torch version and compiler flags in the system's
temporary directory. The first compiled call of each model therefore runs first with an empty
temporary directory too ("fresh machine": nothing of the compiler kept anywhere), and the cold and
warm ones then share that temporary directory, which now holds the header: they do not depend on
what this machine compiled before either.

The pipeline measures in two jobs (``part``: ``serial`` and ``threads``, see ``_jobs``) and merges
their rows (``merge``); without a part, one job measures every row.

Each measurement runs in a fresh process (``cost.py --measure SPEC``) with a time limit,
so that a slow ``torch.compile`` is recorded as timed out instead of holding the stage,
and so that its peak RSS (``resource.getrusage``) and, on CUDA, its peak allocated memory
are its own.
"""

import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch
from _common import REPO, draw_inputs, run
from _yardstick import yardstick_s
from tqdm import tqdm

DTYPES = {"float32": torch.float32, "float64": torch.float64}
WEIGHTS = {"mean_delay": 1.0, "mean_aoi": 0.5, "mean_energy_j": 50.0}  # the README's quick-start loss
SCRIPT = REPO / "benchmarks" / "diff" / "cost.py"


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def relaxed(mode, E, R, T, tau, compile_, dtype, device, x, repeats, slots=None) -> dict:
    from isaac_net.core.diff import DiffFluid, rollout

    import_s = None
    if compile_:  # the compiler's modules, imported at the first compiled call: timed apart
        t0 = time.perf_counter()
        import torch._dynamo  # noqa: F401
        import torch._inductor.codecache  # noqa: F401  (what loading a kept step needs; compiling imports more)

        import_s = time.perf_counter() - t0
    fwd, bwd = [], []
    for _ in range(repeats + (1 if compile_ else 0)):
        # A fresh model per pass: a reset state would still link to the previous pass's graph.
        # torch.compile caches per process, so only the first pass compiles.
        net = DiffFluid(E, R, device, mode=mode, tau=tau, dtype=dtype, compile=compile_)
        if slots is not None:  # "autograd": the plain per-slot design, the baseline
            net.slot_grad = slots
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
    out = {"slots": net.slot_grad if mode == "L1" else None}
    if compile_:  # the first pass pays for compilation; report it apart
        out["first_forward_s"], out["first_backward_s"] = fwd.pop(0), bwd.pop(0)
        out["import_s"] = import_s
    return {**out, "forward_s": min(fwd), "backward_s": min(bwd)}


def discrete(level, E, R, T, dtype, device, x, repeats, seed, backend=None, first_call=False,
             repeat_time_s=None) -> dict:
    """A forward rollout of a discrete level (``backend``: make_engine's, None for its default): the
    best of ``repeats`` passes, or of fewer (at least two) once the passes add up to ``repeat_time_s``
    (None: all of them; a pass of many seconds is disturbed by a smaller share of itself)."""
    from isaac_net.core import make_engine

    out = {"backward_s": None}
    send0 = (x["u"][0] < x["p"]).to(dtype)
    if first_call:  # what a user waits for: the kernel's module and numba imported, compiled or loaded
        t0 = time.perf_counter()
        make_engine(level, E, R, device, dtype=dtype, seed=seed, backend=backend).step(
            send0, x["B"], pos=x["pos"], tx_dbm=x["tx"])
        out["first_call_s"] = time.perf_counter() - t0
    elif level == "L2-legacy":  # compile or load a kernel (the numba default's) outside the timing
        make_engine(level, 1, R, device, dtype=dtype, seed=seed, backend=backend).step(
            send0[:1], x["B"][:1], pos=x["pos"][:1], tx_dbm=x["tx"][:1])
    times = []
    for _ in range(repeats):
        eng = make_engine(level, E, R, device, dtype=dtype, seed=seed, backend=backend)
        if backend == "cuda_graph":  # capture every phase's graph (L1, QA: one), outside the timing
            for t in range(eng.graph_period_steps):
                eng.step((x["u"][t % T] < x["p"]).to(dtype), x["B"], pos=x["pos"], tx_dbm=x["tx"])
            eng.reset()
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            for t in range(T):
                eng.step((x["u"][t] < x["p"]).to(dtype), x["B"], pos=x["pos"], tx_dbm=x["tx"])
        _sync(device)
        times.append(time.perf_counter() - t0)
        if repeat_time_s is not None and len(times) >= 2 and sum(times) >= repeat_time_s:
            break
    return {**out, "forward_s": min(times), "passes": len(times)}


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
        r = relaxed(spec["name"], E, R, T, spec["tau"], spec["compile"], dtype, dev, x, spec["repeats"],
                    spec.get("slots"))
    else:
        r = discrete(spec["name"], E, R, T, dtype, dev, x, spec["repeats"], spec["seed"],
                     spec.get("backend"), first_call=bool(spec.get("cache")),
                     repeat_time_s=spec.get("repeat_time_s"))
    r["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    is_cuda = torch.device(dev).type == "cuda"
    r["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20 if is_cuda else None
    return r


PARENT_ENV = "ISAAC_COST_PARENT_PID"


def die_with_parent(poll_s: float = 0.2) -> None:
    """In a ``--measure`` child: kill this process group (the child and torch.compile's workers)
    as soon as the parent that started it is gone. The child runs in a session of its own (so
    that a timeout can kill its whole group), which a kill of the parent's group does not reach;
    on Linux the kernel signals it at once (PR_SET_PDEATHSIG), elsewhere a thread polls."""
    parent = int(os.environ.get(PARENT_ENV, "0"))
    if not parent:
        return

    def kill_group(*_):
        os.killpg(os.getpgrp(), signal.SIGKILL)

    if sys.platform.startswith("linux"):
        import ctypes

        signal.signal(signal.SIGTERM, kill_group)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:  # the parent died before the death signal was armed
        kill_group()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        kill_group()

    threading.Thread(target=watch, daemon=True).start()


def run_child(cmd: list[str], timeout_s: float, env: dict | None = None) -> tuple[int | None, str, str]:
    """Run ``cmd`` (a ``--measure`` child) in a fresh process group, killed as a whole after
    ``timeout_s`` (torch.compile starts worker processes of its own) and when this process
    dies (``die_with_parent``). Returns (exit status or None on timeout, stdout, stderr)."""
    env = {**os.environ, **(env or {}), PARENT_ENV: str(os.getpid())}
    # The child measures this checkout's library, whatever other isaac_net the environment installs.
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH")) if x)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            start_new_session=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, "", ""
    except BaseException:  # KeyboardInterrupt, SystemExit from a signal handler: take the child along
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, stdout, stderr


def measure_in_child(spec: dict, timeout_s: float, cache_dir: str | None = None,
                     tmp_dir: str | None = None, numba_dir: str | None = None) -> dict:
    """Run ``measure(spec)`` in a child process (``run_child``), compiling into ``cache_dir`` with
    ``tmp_dir`` as its temporary directory (where inductor keeps its precompiled header), numba
    into ``numba_dir``."""
    cmd = [sys.executable, str(SCRIPT), "--measure", json.dumps(spec)]
    env = {**({"TORCHINDUCTOR_CACHE_DIR": cache_dir} if cache_dir else {}),
           **({"TMPDIR": tmp_dir} if tmp_dir else {}),
           **({"NUMBA_CACHE_DIR": numba_dir} if numba_dir else {})} or None
    returncode, stdout, stderr = run_child(cmd, timeout_s, env)
    if returncode is None:
        return {"error": f"timed out after {timeout_s:g} s"}
    if returncode != 0:
        print(stderr, flush=True)
        last = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return {"error": last[-1] if last else f"exit status {returncode}"}
    return json.loads(stdout.strip().splitlines()[-1])


def _jobs(params: dict, device: str) -> list[dict]:
    """The measurements of one device: relaxed (each mode, compile, threads), the plain
    autograd baselines (eager, one thread), the discrete levels and the large rollout; each with the
    part (``PARTS``) that measures it: ``threads``, on an otherwise idle box, the table's rows at the
    E of ``params["E"]`` (threads side by side, against their autograd baselines), the compiled
    first calls and L2-legacy's two slot loops (the numba kernel loses more to a busy neighbour core
    than eager's per-op overhead does, so their ratio is measured where nothing runs beside it);
    ``serial``, on one core, the comparisons that hold within themselves (the speed-up at more batch
    sizes) and the large rollout."""
    threads = params["threads"] if device == "cpu" else [1]
    warmup = params.get("warmup")
    jobs = []

    def add(part: str, group: list) -> None:
        jobs.extend({**j, "part": part} for j in group)

    l2 = params.get("l2_backends") if params["l2_legacy"] and device == "cpu" else None
    if l2:  # L2-legacy's numba kernel, first with the stage's numba cache empty, then warm
        add("threads", [{"kind": "discrete", "name": "L2-legacy", "E": l2["first_call_E"], "compile": False,
                         "threads": 1, "backend": "numba", "cache": cache} for cache in ("cold", "warm")])
    if warmup and True in params["compile"]:  # first, while each model's cache directory is empty
        add("threads", [{"kind": "relaxed", "name": m, "E": warmup["E"], "compile": True, "threads": 1,
                         "cache": cache} for m in params["modes"] for cache in FIRST_CALLS])
    add("threads", [{"kind": "relaxed", "name": m, "E": E, "compile": c, "threads": th} for E in params["E"]
                    for m in params["modes"] for c in params["compile"] for th in threads])
    # Autograd through every op (L1D: every slot, the baseline design; QAD: the step's ops)
    # against the default eager, whose slot loop (L1D) and step (QAD) are nodes with hand-written backwards.
    add("threads", [{"kind": "relaxed", "name": m, "E": E, "compile": False, "threads": 1,
                     "slots": "autograd"} for E in params["E"] for m in params["modes"]])
    # The speed-up at more batch sizes: L1D per-slot autograd, eager and compiled, one thread; QAD's
    # fused rollout node eager against compile=True's (its forward compiled).
    extra = [E for E in params.get("speedup_E", []) if E not in params["E"]]
    add("serial", [{"kind": "relaxed", "name": "L1", "E": E, "compile": c, "threads": 1,
                    "repeats": params["speedup_repeats"], **({"slots": "autograd"} if slots else {})}
                   for E in extra for c, slots in ((False, True), (False, False), (True, False))
                   if c in params["compile"]])
    add("serial", [{"kind": "relaxed", "name": "QA", "E": E, "compile": c, "threads": 1,
                    "repeats": params["speedup_repeats"]} for E in extra for c in params["compile"]
                   if "QA" in params["modes"]])
    levels = list(params["modes"]) + (["L2-legacy"] if params["l2_legacy"] else [])
    add("threads", [{"kind": "discrete", "name": lv, "E": E, "compile": False, "threads": th}
                    for E in params["E"] for lv in levels for th in threads])
    # L2-legacy's slot loops side by side: eager torch ops and the numba kernel, one thread.
    if l2:
        add("threads", [{"kind": "discrete", "name": "L2-legacy", "E": E, "compile": False, "threads": 1,
                         "backend": b} for E in l2["E"] for b in L2_BACKENDS])
    if device == "cuda":  # the captured steps
        add("threads", [{"kind": "discrete", "name": lv, "E": E, "compile": False, "threads": 1,
                         "backend": "cuda_graph"} for E in params["E"] for lv in levels])
    large = params.get("large")
    if large:
        add("serial", [{"kind": "relaxed", "name": "L1", "E": large["E"], "T": large["T"], "compile": False,
                        "threads": 1, "repeats": 1}])
    return [{**j, "device": device} for j in jobs]


# The first compiled calls, in the order they run: with nothing of the compiler kept (an empty cache
# directory and an empty temporary directory), then an empty cache directory, then the cache that one filled.
FIRST_CALLS = {"fresh": "fresh machine", "cold": "cold cache", "warm": "warm cache"}


# L2-legacy's slot loops timed side by side (make_engine backends).
L2_BACKENDS = ("eager", "numba")


def _variant(job: dict) -> str:
    if job["kind"] == "discrete" and job.get("cache"):
        return f"discrete, numba first call, {FIRST_CALLS[job['cache']]}"
    if job.get("cache"):
        return f"compiled, first call, {FIRST_CALLS[job['cache']]}"
    if job["kind"] == "discrete":
        return {"cuda_graph": "discrete, cuda graph", "eager": "discrete, eager slot loop",
                "numba": "discrete, numba slot loop"}.get(job.get("backend"), "discrete")
    if job.get("slots") == "autograd":
        return "per-slot autograd" if job["name"] == "L1" else "per-op autograd"
    return "compiled" if job["compile"] else "eager"


def _earlier_ratio(row: dict, earlier_s: dict) -> float | None:
    """The reference time of this workload (config ``earlier_s``) over ours (fwd + bwd for L1D, forward for
    L2-legacy); steady-state rows only."""
    if not row["available"] or row["T"] != earlier_s["T"] or "first call" in row["variant"]:
        return None
    if row["model"] == "L1D" and str(row["E"]) in earlier_s["L1D_fwd_bwd"]:
        return sum(earlier_s["L1D_fwd_bwd"][str(row["E"])]) / (row["forward_s"] + row["backward_s"])
    if row["model"] == "L2-legacy":
        return earlier_s["L2_legacy_fwd"] / row["forward_s"]
    return None


def _break_even(warmup: dict, eager_s: float | None, compiled_s: float | None) -> dict:
    """When ``compile=True`` pays for itself: the number of rollouts N after which N rollouts with it
    (the first call, then N - 1 steady ones) take no longer than N eager ones, from the warm-up's first
    calls and the table's steady rollouts at its E (best of the repeats, eager and compiled measured the
    same way); the eager first call counted as a steady one. None where a time is missing or where the
    compiled rollout is not the faster (``pays`` False: it never pays)."""
    out = {"eager_steady_s": eager_s, "compiled_steady_s": compiled_s, "pays": None,
           **{f"{cache}_break_even": None for cache in FIRST_CALLS}}
    if eager_s is None or compiled_s is None:
        return out
    gain_s = eager_s - compiled_s
    out["pays"] = gain_s > 0
    for cache in FIRST_CALLS:
        first_s = warmup[f"{cache}_s"]
        if out["pays"] and first_s is not None:
            out[f"{cache}_break_even"] = max(1, math.ceil((first_s - compiled_s) / gain_s))
    return out


def _l2_rows(rows: list, params: dict, T: int, yard_s: float | None = None) -> tuple[list, dict | None]:
    """L2-legacy's slot loops side by side per E (seconds per rollout, cell-steps per second, the
    numba kernel's speed-up over eager) and the numba kernel's first calls against their targets.
    With ``l2_backends["anchor"]`` (an earlier commit's default step, benchmarks/perf/l2_anchor.py)
    and this run's yardstick ``yard_s``, also the default step against that commit's, whose time is
    scaled by the yardsticks' ratio (``anchor_s``, ``anchor_speedup``: the issue's bar)."""
    l2 = params.get("l2_backends") if params["l2_legacy"] else None
    if not l2:
        return [], None

    def row(variant, E=None):
        hits = [r for r in rows if r["model"] == "L2-legacy" and r["variant"] == variant and r["available"]
                and (E is None or r["E"] == E)]
        return hits[0] if hits else None

    targets = {int(E): float(x) for E, x in l2.get("speedup_targets", [])}
    side = []
    for E in l2["E"]:
        s = {b: row(f"discrete, {b} slot loop", E) for b in L2_BACKENDS}
        secs = {b: s[b]["forward_s"] if s[b] else None for b in L2_BACKENDS}
        side.append({"E": E, **{f"{b}_s": secs[b] for b in L2_BACKENDS},
                     **{f"{b}_cell_steps_per_s": E * T / secs[b] if secs[b] else None for b in L2_BACKENDS},
                     "speedup": secs["eager"] / secs["numba"] if secs["eager"] and secs["numba"] else None,
                     "target_speedup": targets.get(E)})
        side[-1]["target_met"] = (None if side[-1]["speedup"] is None or E not in targets
                                  else side[-1]["speedup"] >= targets[E])
        side[-1].update(_anchored(l2.get("anchor"), E, secs["numba"], yard_s, targets.get(E)))
    calls = {c: row(f"discrete, numba first call, {FIRST_CALLS[c]}") for c in ("cold", "warm")}
    first = {"E": l2["first_call_E"], "cold_target_s": l2["cold_s"], "warm_target_s": l2["warm_s"]}
    for c, r in calls.items():
        first[f"{c}_s"] = r["first_call_s"] if r else None
        first[f"{c}_met"] = None if r is None else r["first_call_s"] <= l2[f"{c}_s"]
    return side, first


def _anchored(anchor: dict | None, E: int, numba_s: float | None, yard_s: float | None,
              target: float | None) -> dict:
    """The default step at ``E`` against the ``anchor`` commit's: its rollout time there (config,
    measured on another box or day) times this run's yardstick over the one timed beside it
    (``anchor_s``), over the numba rollout's (``anchor_speedup``); None where a time is missing."""
    if not anchor or str(E) not in anchor["rollout_s"]:
        return {}
    scaled = (anchor["rollout_s"][str(E)] * yard_s / anchor["yardstick_s"][str(E)]) if yard_s else None
    speedup = scaled / numba_s if scaled and numba_s else None
    return {"anchor_commit": str(anchor["commit"]), "anchor_s": scaled, "anchor_speedup": speedup,
            "anchor_met": None if speedup is None or target is None else speedup >= target}


# The stage's measuring parts, each a job of its own (rules cost_serial, cost_threads), merged by the
# stage's job (``_jobs`` says which part measures a row): ``threads`` reserves every core the stage
# sweeps and runs alone, ``serial`` one core, beside the pipeline's other one-core jobs.
PARTS = ("serial", "threads")


def _common(params: dict) -> dict:
    """The settings every measurement shares."""
    return {"R": params["R"], "T": params["T"], "tau": float(params["tau"]), "dtype": params["dtype"],
            "p": params["p"], "sizes_bytes": params["sizes_bytes"], "repeats": params["repeats"],
            "repeat_time_s": params.get("repeat_time_s"), "seed": params["seed"]}


def main(stage, params: dict, out: dict, part: str | None = None) -> None:
    """Wall time and memory of relaxed and discrete rollouts. ``part``: one of ``PARTS`` (its rows,
    to ``out["json"]``), ``merge`` (the parts' rows, ``out["parts"]``, as the stage's artifact) or
    None (every row, in this job)."""
    if part == "merge":
        parts = [json.loads(open(path).read()) for path in out["parts"]]
        yard = next((p["yardstick_s"] for p in parts if p.get("yardstick_s") is not None), None)
        # the job index orders the merged table as one job would have
        rows = sorted((r for p in parts for r in p["rows"]), key=lambda r: r["job"])
        unavailable = {k: v for p in parts for k, v in p["unavailable"].items()}
        devices = list(dict.fromkeys(d for p in parts for d in p["devices"]))
        _summarise(stage, params, _common(params), devices, _unindexed(rows), unavailable, out, yard)
        return
    if part not in (None, *PARTS):
        raise ValueError(f"part: expected one of {', '.join(PARTS)}, merge or none, got {part!r}")
    devices = [stage.device] + (["cuda"] if stage.device == "cpu" and torch.cuda.is_available() else [])
    jobs = [{**j, "job": i} for i, j in enumerate(j for dev in devices for j in _jobs(params, dev))]
    # the box's yardstick where nothing runs beside it: in the part that has every core to itself
    yard = yardstick_s(int(params["repeats"])) if part in (None, "threads") else None
    rows, unavailable = _measure_all([j for j in jobs if part is None or j["part"] == part], params)
    if part is None:
        _summarise(stage, params, _common(params), devices, _unindexed(rows), unavailable, out, yard)
    else:
        stage.write_json(out["json"], {"part": part, "rows": rows, "unavailable": unavailable,
                                       "devices": devices, "yardstick_s": yard})


def _unindexed(rows: list) -> list:
    """The table's rows without the job index that orders the parts' rows."""
    return [{k: v for k, v in r.items() if k != "job"} for r in rows]


def _measure_all(jobs: list, params: dict) -> tuple[list, dict]:
    """Every job's row (``_measure_job``), in order, with the discrete levels that failed."""
    rows, unavailable, common = [], {}, _common(params)
    # per model: the cache directory of the cold, warm and steady rows, the fresh machine's, and the
    # temporary directory of the first calls (the fresh machine builds inductor's header into it)
    dirs = {m: {d: tempfile.mkdtemp(prefix=f"isaac_cost_{d}_{m}_") for d in ("cache", "fresh", "tmp")}
            for m in params["modes"]}
    dirs["L2-legacy"] = {"numba": tempfile.mkdtemp(prefix="isaac_cost_numba_")}  # empty for the cold call
    try:
        for job in tqdm(jobs, desc="cost", mininterval=2.0):
            if job["name"] in unavailable and job["kind"] == "discrete":
                continue
            _measure_job(job, common, params, dirs, rows, unavailable)
    finally:
        for d in (d for model in dirs.values() for d in model.values()):
            shutil.rmtree(d, ignore_errors=True)
    return rows, unavailable


def _measure_job(job: dict, common: dict, params: dict, dirs: dict, rows: list, unavailable: dict) -> None:
    """One row of the table from a child process (a discrete level that fails is marked unavailable)."""
    spec = {**common, **job}
    model_dirs = dirs.get(job["name"], {})
    first_call = job.get("cache")
    cache = model_dirs.get("fresh" if first_call == "fresh" else "cache")
    r = measure_in_child(spec, params["timeout_s"], cache, model_dirs.get("tmp") if first_call else None,
                         model_dirs.get("numba"))
    model = f"{job['name']}D" if job["kind"] == "relaxed" else job["name"]
    if "error" in r:
        where = f"E={job['E']} compile={job['compile']} threads={job['threads']} device={job['device']}"
        print(f"[cost] {model} {where}: {r['error']}", flush=True)
        if job["kind"] == "discrete" and not r["error"].startswith("timed out"):
            unavailable[job["name"]] = r["error"]
            return
    rows.append({"model": model, "variant": _variant(job), "device": job["device"], "E": job["E"],
                 "R": spec["R"], "T": spec["T"], "compile": job["compile"], "threads": job["threads"],
                 **r, "available": "error" not in r, "job": job["job"]})


def _summarise(stage, params: dict, common: dict, devices: list, rows: list, unavailable: dict,
               out: dict, yard: float | None = None) -> None:
    """The speed-ups, the compile warm-up, the targets and the summary (``yard``: ``yardstick_s``'s
    time, None where not measured), written with the table."""
    from isaac_net.core import CellConfig

    for r in rows:
        r["earlier_ratio"] = _earlier_ratio(r, params["earlier_s"])

    def total(model, variant, E):
        key = (model, variant, E, common["T"], 1, stage.device)
        hits = [r["forward_s"] + r["backward_s"] for r in rows if r["available"]
                and (r["model"], r["variant"], r["E"], r["T"], r["threads"], r["device"]) == key]
        return min(hits) if hits else None

    speedups = []
    for E in sorted({*params["E"], *params.get("speedup_E", [])}):
        base = total("L1D", "per-slot autograd", E)
        eager, comp = total("L1D", "eager", E), total("L1D", "compiled", E)
        speedups.append({"E": E, "per_slot_autograd_s": base, "eager_s": eager, "compiled_s": comp,
                         "eager_speedup": base / eager if base and eager else None,
                         "compiled_speedup": base / comp if base and comp else None})
    targets = []
    for t in params["targets_s"]:
        measured = total(t["model"], t["variant"], t["E"])
        targets.append({**t, "measured_s": measured, "met": None if measured is None else measured <= t["s"]})
    warmups = []
    for m in params["modes"]:
        first = {r["variant"]: r for r in rows
                 if r["model"] == f"{m}D" and r["available"] and "first call" in r["variant"]}
        calls = {name: first.get(f"compiled, first call, {what}") for name, what in FIRST_CALLS.items()}
        if not any(calls.values()):
            continue
        cold, warm = calls["cold"], calls["warm"]
        w = {"model": f"{m}D", "E": params["warmup"]["E"]}
        for name, r in calls.items():  # what a user waits for: imports included
            w[f"{name}_s"] = r["import_s"] + r["first_forward_s"] + r["first_backward_s"] if r else None
            w[f"{name}_import_s"] = r["import_s"] if r else None
            w[f"{name}_steady_s"] = r["forward_s"] + r["backward_s"] if r else None
        w["cold_ratio"] = w["cold_s"] / w["cold_steady_s"] if cold else None  # both in the cold process
        t = params["warmup"]
        w["cold_met"] = None if cold is None else (w["cold_s"] <= t["cold_s"]
                                                   and w["cold_ratio"] <= t["cold_ratio"])
        w["warm_met"] = None if warm is None else w["warm_s"] <= t["warm_s"]
        w.update(_break_even(w, total(f"{m}D", "eager", w["E"]), total(f"{m}D", "compiled", w["E"])))
        warmups.append(w)
    l2_backends, l2_first_calls = _l2_rows(rows, params, common["T"], yard)
    large = [r for r in rows if r["available"] and params.get("large") and r["E"] == params["large"]["E"]
             and r["T"] == params["large"]["T"]]
    summary = {
        "dtype": params["dtype"],
        "tau": common["tau"],
        "num_slots": CellConfig().num_slots,
        "peak_rss_mib": max((r["peak_rss_mib"] for r in rows if r["available"]), default=None),
        "l2_legacy_available": params["l2_legacy"] and "L2-legacy" not in unavailable,
        "compile_available": any(r["compile"] and r["available"] for r in rows),
        "cuda_available": "cuda" in devices,
        "num_failed": sum(not r["available"] for r in rows),
        "yardstick_s": yard,
    }
    stage.write_json(out["json"], {"summary": summary, "table": rows, "speedups": speedups,
                                   "warmups": warmups, "targets": targets, "l2_backends": l2_backends,
                                   "l2_first_calls": l2_first_calls,
                                   "large": large[0] if large else None, "unavailable": unavailable})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        die_with_parent()
        print(json.dumps(measure(json.loads(sys.argv[2]))))
    else:
        run(main, globals().get("snakemake"))
