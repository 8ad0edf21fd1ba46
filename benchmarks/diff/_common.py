"""Shared plumbing of the stage scripts: run under snakemake or from the command line,
log to the rule's log file, set torch threads, and stamp every artifact with provenance.

No plotting here (see ``_plots.py``) and no model logic (that is the library's).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from _hashes import record, seal

from isaac_net.core import kpi

#: The per-env KPI means, every table's order, and their labels (the KPI registry's).
KPIS = kpi.BATCH_KEYS
#: The batch keys of the KPIs a calibration fits (a loss weight in the registry).
FITTED_KPIS = tuple(k.batch_key for k in kpi.KPIS if k.loss_weight > 0)

REPO = Path(__file__).resolve().parents[2]
KPI_LABEL = {k.batch_key: k.label for k in kpi.KPIS}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


#: The numeric stack beside torch whose versions a stage records: L2-legacy's finite differences
#: move in their third digit with another machine's rounding (docs/design.md, section 7), so a page
#: names what it ran on.
PACKAGES = ("numpy", "numba", "llvmlite", "scipy", "pandas", "cma", "optuna")


def package_versions() -> dict:
    """``{name: version}`` of :data:`PACKAGES` as installed (None for one that is not)."""
    from importlib import metadata

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu ({cpu_model()})"


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def jsonable(x):
    """Tensors, numpy scalars and tuples to plain JSON values; NaN and inf become None."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().tolist()
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return x


class Stage:
    """One run of a stage: log redirection, torch threads, provenance and JSON output.

    :param name: stage name, e.g. ``"equivalence"``.
    :param params: the stage's config (recorded verbatim in the provenance).
    :param profile: config profile, e.g. ``"full"``.
    :param threads: torch intra-op threads (the rule's ``threads:``).
    :param device: ``"cpu"`` or ``"cuda[:n]"``.
    :param log: log file (stdout and stderr go there, tqdm bars included), or None.
    """

    def __init__(self, name: str, params: dict, profile: str, threads: int, device: str = "cpu",
                 log: str | None = None):
        self.name, self.params, self.profile = name, params, profile
        self.threads, self.device, self.log = int(threads), device, log
        self._stack = contextlib.ExitStack()
        # Under Snakemake: what the job reads (inputs, params, script), hashed into the provenance,
        # and its named outputs (a ``csv`` output gets the artifact's tidy table).
        self.job: dict | None = None
        self.outputs: dict = {}

    def __enter__(self) -> Stage:
        if self.log:
            Path(self.log).parent.mkdir(parents=True, exist_ok=True)
            fh = self._stack.enter_context(open(self.log, "w", buffering=1))
            self._stack.enter_context(contextlib.redirect_stdout(fh))
            self._stack.enter_context(contextlib.redirect_stderr(fh))
        torch.set_num_threads(self.threads)
        self.load_start = list(os.getloadavg())
        self.started_utc = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.started_unix = time.time()  # the page spans the run from the stages' starts and wall times
        self.t0 = time.perf_counter()
        print(f"[{self.name}] profile={self.profile} threads={self.threads} device={self.device}", flush=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:  # into the log too, not only to snakemake's terminal
            traceback.print_exception(exc_type, exc, tb)
        self._stack.close()

    def provenance(self) -> dict:
        commit = _git("rev-parse", "HEAD")
        # Dirty = the sources differ from the commit. The committed artifacts and page are
        # rewritten by the run itself, so they do not count.
        status = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)benchmarks/diff/results", ":(exclude)reports/checks_and_measurements.md",
                      ":(exclude)reports/checks_and_measurements.trace.json",
                      ":(exclude)reports/figures")
        # RNG seeds: ``seed`` and ``<what>_seed``; ``envs_per_seed`` is a count of cells.
        seeds = {k: v for k, v in self.params.items()
                 if k == "seed" or (k.endswith("_seed") and not k.endswith("_per_seed"))}
        return {
            "stage": self.name,
            "profile": self.profile,
            "config": self.params,
            "seeds": seeds,
            "git_commit": commit or "unknown",
            "git_dirty": bool(status) if status is not None else None,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "packages": package_versions(),
            "device": self.device,
            "device_name": device_name(self.device),
            "torch_threads": torch.get_num_threads(),
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "hostname": platform.node(),
            "started_utc": self.started_utc,
            "started_unix": self.started_unix,
            "load_avg_start": self.load_start,
            "load_avg_end": list(os.getloadavg()),
            "wall_s": time.perf_counter() - self.t0,
            "peak_rss_mib": peak_rss_mib(),
        }

    def write_json(self, path: str, payload: dict) -> None:
        """Write ``payload`` plus ``provenance`` (strict JSON: NaN/inf become null)."""
        # Threads may have been changed by the stage (cost.py sweeps them); restore the rule's.
        torch.set_num_threads(self.threads)
        data = jsonable({**payload, "provenance": self.provenance()})
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if "csv" in self.outputs and str(path) == str(self.outputs.get("json")):
            from _tables import write_csv  # pandas: imported by the stages that write tables only

            for written in write_csv(Path(path).stem, data, self.outputs):
                print(f"[{self.name}] wrote {written}", flush=True)
        if self.job is not None:  # what it was computed from, its other outputs so far, itself
            rec = data["provenance"]["inputs"] = record(
                **self.job, outputs=[v for v in self.outputs.values() if str(v) != str(path)])
            seal(data, rec)
        Path(path).write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
        print(f"[{self.name}] wrote {path} after {data['provenance']['wall_s']:.1f} s", flush=True)


_SOURCE_INPUTS = ("library", "helpers", "scripts")


def run(main, smk=None) -> None:
    """Call ``main(stage, params, outputs)`` under snakemake (``smk``) or from argv.

    Under snakemake the params are ``params.stage`` (the stage's config), ``params.profile``,
    ``params.device`` and optionally ``params.part``; outputs are the rule's named outputs and
    named data inputs (an artifact another stage wrote).
    From the command line::

        python benchmarks/diff/<stage>.py --params params.json --out json=out.json [--out figure=f.png]
    """
    if smk is not None:
        params = dict(smk.params.stage)
        part = getattr(smk.params, "part", None)
        # The rule's named outputs, and its named data inputs (the sources it depends on are not data).
        outputs = {**{k: v for k, v in smk.input.items() if k not in _SOURCE_INPUTS},
                   **{k: v for k, v in smk.output.items()}}
        stage = Stage(smk.rule, params, smk.params.profile, smk.threads, smk.params.device,
                      smk.log[0] if smk.log else None)
        # Snakemake runs a copy of the script, with ``__file__`` set to the original.
        script = getattr(sys.modules.get("__main__"), "__file__", None)
        stage.job = {"inputs": list(smk.input), "params": dict(smk.params.items()), "script": script}
        stage.outputs = dict(smk.output.items())
    else:
        ap = argparse.ArgumentParser(description=main.__doc__)
        ap.add_argument("--params", required=True, help="JSON file with the stage's config")
        ap.add_argument("--out", action="append", default=[], metavar="NAME=PATH", help="named output")
        ap.add_argument("--part", default=None)
        ap.add_argument("--profile", default="adhoc")
        ap.add_argument("--device", default="cpu")
        ap.add_argument("--threads", type=int, default=1)
        ap.add_argument("--log", default=None)
        a = ap.parse_args()
        params = json.loads(Path(a.params).read_text())
        part = a.part
        outputs = dict(o.split("=", 1) for o in a.out)
        stage = Stage(Path(sys.argv[0]).stem + (f"_{part}" if part else ""), params, a.profile,
                      a.threads, a.device, a.log)
        stage.outputs = outputs
    with stage:
        if part is None:
            main(stage, params, outputs)
        else:
            main(stage, params, outputs, part=part)


def parts(doc: str, **fns):
    """``main`` of a stage script with several parts, one per rule (the rule's ``params.part``)."""

    def main(stage, params: dict, out: dict, part: str | None = None) -> None:
        if part not in fns:
            raise ValueError(f"unknown part {part!r}; expected one of: {', '.join(fns)}")
        fns[part](stage, params, out)

    main.__doc__ = doc
    return main


def generator(seed: int, device: str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def draw_inputs(E: int, R: int, T: int, sizes_bytes, seed: int, *, p: float | None = None,
                tx_dbm: float | None = None, snr_db=None, dtype=torch.float64, device: str = "cpu") -> dict:
    """The inputs of a scenario, all from one seeded generator.

    :output B: ``[E, R]`` message sizes, bytes, each robot one of ``sizes_bytes``.
    :output u: ``[T, E, R]`` fixed uniforms of the binary sends (send = u < p).
    :output pos: ``[E, R, 2]`` positions, m, uniform in [40, 140]^2 (gNB at the origin).
    :output snr_db: ``[E, R]`` dB, uniform in ``snr_db = [low, high]`` (when a range is given).
    :output p, tx: ``[E, R]`` constant send probability and transmit power, dBm (when given).
    """
    g = generator(seed)
    sizes = torch.tensor([float(s) for s in sizes_bytes], dtype=dtype)
    x = {"B": sizes[torch.randint(len(sizes), (E, R), generator=g)],
         "u": torch.rand(T, E, R, generator=g, dtype=dtype),
         "pos": 40.0 + 100.0 * torch.rand(E, R, 2, generator=g, dtype=dtype)}
    if snr_db is not None:
        lo, hi = float(snr_db[0]), float(snr_db[1])
        x["snr_db"] = lo + (hi - lo) * torch.rand(E, R, generator=g, dtype=dtype)
    if p is not None:
        x["p"] = torch.full((E, R), float(p), dtype=dtype)
    if tx_dbm is not None:
        x["tx"] = torch.full((E, R), float(tx_dbm), dtype=dtype)
    return {k: v.to(device) for k, v in x.items()}


def cell_config(overrides: dict):
    from isaac_net.core import CellConfig

    return CellConfig(**overrides)


def rel_err(x: float, ref: float) -> float:
    return abs(x - ref) / abs(ref) if ref != 0 else (0.0 if x == 0 else math.inf)


def loglog_slope(xs, ys) -> float | None:
    """Least-squares slope of log y against log x over the points with x, y > 0 (``numpy.polyfit``)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y and y > 0]
    if len(pts) < 2 or len({p[0] for p in pts}) < 2:
        return None
    lx, ly = zip(*pts, strict=True)
    return float(np.polyfit(lx, ly, 1)[0])


def ratio_ci(model: np.ndarray, ref: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple:
    """Ratio of means model / ref and its paired percentile bootstrap 95 % interval over replicates
    (``scipy.stats.bootstrap``); ``(-inf, inf)`` where the resampled denominator crosses zero."""
    ratio = float(model.mean() / ref.mean()) if ref.mean() != 0 else math.nan

    def stat(m, r, axis=-1):
        with np.errstate(divide="ignore", invalid="ignore"):
            return m.mean(axis) / r.mean(axis)

    # The bootstrap distribution of a ratio whose denominator crosses zero is not an interval.
    idx = rng.integers(0, len(ref), size=(n_boot, len(ref)))
    pos = (ref[idx].mean(1) > 0).mean()
    if min(pos, 1.0 - pos) > 0.025:
        return ratio, -math.inf, math.inf
    import scipy.stats  # here: every stage job and cost measurement imports this module (1.2 s)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples (all equal) are reported as NaN
        res = scipy.stats.bootstrap((model, ref), stat, paired=True, vectorized=True, n_resamples=n_boot,
                                    confidence_level=0.95, method="percentile", random_state=rng)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ratio, math.nan, math.nan
    return ratio, lo, hi
