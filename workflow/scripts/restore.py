"""Restore Snakemake's view of which committed outputs are up to date, from their input hashes.

git gives every file of a fresh clone the clone's time and keeps no Snakemake metadata, so
Snakemake cannot tell a committed artifact from a stale one. Each artifact records in its
provenance (``inputs``; the page in its trace) the SHA-256 of its params and of every file it
read: the stage script, the modules it imported, the library, upstream artifacts
(``benchmarks/diff/_hashes.py``). For every job of the pipeline's DAG, in dependency order,
this script compares that record with the checkout:

- it matches (and the job's upstream jobs match): the job's outputs get a file time one second
  after its newest input, and Snakemake's metadata record for them is written as a finished
  run would (params, input list, code), so Snakemake's default ``--rerun-triggers`` (mtime,
  params, input, code, software-env) see them as up to date, and a later changed setting
  reruns the stage even without a second restore;
- it does not (a changed param or source, an artifact without hashes or edited by hand,
  a missing output, an upstream job that reruns): its outputs are dated one second before
  its newest input and their metadata record is removed, so Snakemake reruns the job.

Nothing is ever computed or deleted. ``make restore`` runs it for the full profile::

    python workflow/scripts/restore.py [--configfile config/smoke.yaml] [--dry-run]

Snakemake has no public API for a job's params, so this builds the DAG through its Python API
and its workflow object (tested with Snakemake 9).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
from _hashes import mismatches, sealed  # noqa: E402


def recorded_inputs(outputs) -> tuple[dict | None, list[str]]:
    """The hash record in a job's JSON outputs (an artifact's ``provenance.inputs``, the trace's
    ``inputs``), and why a JSON output is not as its run wrote it."""
    for out in outputs:
        if str(out).endswith(".json") and Path(out).is_file():
            try:
                data = json.loads(Path(out).read_text())
            except (OSError, ValueError):
                return None, [f"{out} is not JSON"]
            if isinstance(data, dict):
                rec = (data.get("provenance") or {}).get("inputs") or data.get("inputs")
                if rec:
                    return rec, [] if sealed(data, rec) else [f"{out} differs from the one its run wrote"]
    return None, []


def _mtime(path: str) -> float:
    return os.stat(path).st_mtime


def _set_time(path: str, t: float) -> None:
    """Date a file, or a directory output with everything in it (Snakemake's timestamp file too)."""
    p = Path(path)
    if p.is_dir():
        for sub in sorted(p.rglob("*"), reverse=True):
            os.utime(sub, (t, t), follow_symlinks=False)
    os.utime(p, (t, t))


def _script(job) -> str | None:
    script = job.rule.script
    if script is None:
        return None
    base = Path(str(job.rule.snakefile)).parent
    return os.path.relpath(os.path.normpath(base / str(script)), Path.cwd())


def restore(configfiles=(), targets=("report",), dry_run: bool = False, log=print) -> dict[str, list[str]]:
    """Date the outputs of every job of ``targets`` (and write or drop their metadata) by whether
    their recorded hashes match the checkout; return ``{output: reasons}`` (empty: up to date)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        ExecutionSettings,
        OutputSettings,
        RemoteExecutionSettings,
        ResourceSettings,
        StorageSettings,
    )

    result: dict[str, list[str]] = {}
    with SnakemakeApi(OutputSettings()) as api:
        wf_api = api.workflow(resource_settings=ResourceSettings(cores=1),
                              config_settings=ConfigSettings(configfiles=[Path(c) for c in configfiles]),
                              storage_settings=StorageSettings(), snakefile=Path("Snakefile"))
        wf_api.dag(DAGSettings(targets=set(targets), forceall=True))
        wf = wf_api._workflow
        # As a local run would have them: its metadata records are written as that run writes them.
        wf.execution_settings, wf.remote_execution_settings = ExecutionSettings(), RemoteExecutionSettings()
        wf._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
        wf._build_dag()
        dag = wf.dag
        producer = {str(f): job for job in dag.jobs for f in job.output}
        stale: set = set()
        for level in dag.toposorted():
            for job in sorted(level, key=lambda j: j.rule.name):
                outputs = [str(f) for f in job.output]
                if not outputs:
                    continue
                inputs = [str(f) for f in job.input]
                script = _script(job)
                why = [f"{o} is missing" for o in outputs if not os.path.exists(o)]
                why += [f"{i} is rerun" for i in inputs if i in producer and producer[i] in stale]
                if not why:
                    params = dict(job.params.items())
                    rec, why = recorded_inputs(outputs)
                    why += mismatches(rec, inputs, params, script, Path.cwd())
                sources = [i for i in inputs + ([script] if script else []) if os.path.exists(i)]
                newest = max((_mtime(i) for i in sources), default=None)
                for o in outputs:
                    result[o] = why
                if why:
                    stale.add(job)
                    log(f"stale   {job.rule.name}: {outputs[0]} ({'; '.join(why[:3])}"
                        f"{'; ...' if len(why) > 3 else ''})")
                else:
                    log(f"current {job.rule.name}: {', '.join(outputs)}")
                if dry_run or newest is None:
                    continue
                for o in outputs:
                    if os.path.exists(o):
                        _set_time(o, newest + (-1.0 if why else 1.0))
                if why:
                    for o in job.output:
                        wf.persistence.cleanup_metadata(o)
                else:
                    wf.async_run(wf.persistence.finished(job))
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", action="append", default=[],
                    help="a profile, as for snakemake (relative to the repository)")
    ap.add_argument("--target", action="append", default=None, help="snakemake target (default: report)")
    ap.add_argument("--dry-run", "-n", action="store_true", help="report, change nothing")
    a = ap.parse_args(argv)
    os.chdir(REPO)  # Snakemake's working directory: the repository (config files relative to it)
    result = restore(a.configfile, tuple(a.target or ["report"]), a.dry_run)
    current = sum(not why for why in result.values())
    print(f"restore: {current} of {len(result)} outputs up to date by their hashes, "
          f"{len(result) - current} left to rerun{' (dry run: nothing changed)' if a.dry_run else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
