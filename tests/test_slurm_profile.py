"""The SLURM workflow profile (workflow/profiles/slurm) against the real workflow.

A dry run of the ci pipeline through the profile (no cluster needed):

    snakemake -n --workflow-profile workflow/profiles/slurm --configfile config/ci.yaml report

checks that the profile parses with snakemake-executor-plugin-slurm's settings, that every
stage rule of the workflow has its own resources entry (runtime, mem_mb) and gets as many
CPUs as threads, and that the report is rendered locally. The real thing, on a throwaway
single-node SLURM cluster, is tests/slurm/run_local_cluster.sh.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "snakemake_executor_plugin_slurm",
    reason="snakemake-executor-plugin-slurm is not installed (pip install snakemake-executor-plugin-slurm)",
)

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "workflow" / "profiles" / "slurm"
GPU_PROFILE = PROFILE / "gpu"
CI_CONFIG = "config/ci.yaml"
TARGET = "report"
LOCAL_RULES = {"report", "page"}  # rendered by the submitting snakemake (localrules in the Snakefile)


def _snakemake() -> str:
    exe = Path(sys.executable).with_name("snakemake")
    return str(exe) if exe.exists() else (shutil.which("snakemake") or "snakemake")


def _load(profile_dir: Path) -> dict:
    return yaml.safe_load((profile_dir / "config.yaml").read_text())


def _dry_run(profile_dir: Path, *extra: str) -> str:
    if not (REPO / "Snakefile").exists() and not (REPO / "workflow" / "Snakefile").exists():
        pytest.skip("the pipeline's Snakefile is not in this checkout")
    if not (REPO / CI_CONFIG).exists():
        pytest.skip(f"{CI_CONFIG} is not in this checkout")
    # --cores: a dry run caps threads at the local cores; 64 shows each rule's own threads.
    # --configfile takes several files: keep it before the other options and the target.
    cmd = [
        _snakemake(),
        "--configfile",
        CI_CONFIG,
        "-n",
        "--nolock",
        "--forceall",
        "--cores",
        "64",
        "--workflow-profile",
        str(profile_dir.relative_to(REPO)),
        *extra,
        TARGET,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAKEMAKE_")}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"dry run failed:\n{' '.join(cmd)}\n{out[-4000:]}"
    return out


def _jobs(out: str) -> list[dict]:
    """Every job block of a dry run: {"rule", "local", "threads", "resources"}."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", out):
        m = re.match(r"(local)?rule (\w+):\n", block)
        if not m:
            continue
        body = block.split("\n\n", 1)[0]
        res = {}
        rm = re.search(r"^\s+resources: (.*)$", body, re.M)
        if rm:
            for item in rm.group(1).split(", "):
                k, _, v = item.partition("=")
                res[k.strip()] = v.strip()
        tm = re.search(r"^\s+threads: (\d+)$", body, re.M)
        jobs.append(
            {
                "rule": m.group(2),
                "local": bool(m.group(1)),
                "threads": int(tm.group(1)) if tm else 1,
                "resources": res,
            }
        )
    return jobs


@pytest.fixture(scope="module")
def ci_dry_run() -> str:
    return _dry_run(PROFILE)


def test_profile_selects_slurm_executor():
    prof = _load(PROFILE)
    assert prof["executor"] == "slurm"
    assert int(prof["jobs"]) >= 1
    for key in ("runtime", "mem_mb", "cpus_per_task"):
        assert key in prof["default-resources"], key
    for rule, res in prof["set-resources"].items():
        assert {"runtime", "mem_mb", "cpus_per_task"} <= set(res), f"{rule}: {res}"
        assert int(res["runtime"]) > 0 and int(res["mem_mb"]) > 0


def test_dry_run_submits_every_stage_with_its_resources(ci_dry_run):
    prof = _load(PROFILE)
    jobs = _jobs(ci_dry_run)
    assert jobs, ci_dry_run[-3000:]
    # (a local rule declared as such is test_report_and_plots_render_locally's business)
    remote = [j for j in jobs if not j["local"] and j["rule"] not in LOCAL_RULES | {"all"}]
    assert remote, "no job would be submitted to SLURM"
    missing = sorted({j["rule"] for j in remote} - set(prof["set-resources"]))
    assert not missing, f"stage rules without an entry in {PROFILE}/config.yaml set-resources: {missing}"
    for j in remote:
        want = prof["set-resources"][j["rule"]]
        res = j["resources"]
        assert res.get("runtime") == str(want["runtime"]), (j["rule"], res)
        assert res.get("mem_mb") == str(want["mem_mb"]), (j["rule"], res)
        assert int(res["cpus_per_task"]) >= j["threads"], (j["rule"], j["threads"], res)


def test_report_and_plots_render_locally(ci_dry_run):
    # Snakemake 9's dry run prints local jobs as "rule x:" too, so read the directive itself.
    m = re.search(r"^localrules:\s*\n((?:[ \t]+\w+,?[ \t]*\n)+)", (REPO / "Snakefile").read_text(), re.M)
    assert m, "the Snakefile declares no `localrules:` block (the report would be a SLURM job)"
    declared = set(re.findall(r"\w+", m.group(1)))
    assert LOCAL_RULES <= declared, f"localrules {sorted(declared)} lack {sorted(LOCAL_RULES - declared)}"
    assert {j["rule"] for j in _jobs(ci_dry_run)} >= LOCAL_RULES


def test_cost_parts_reserve_their_thread_counts(ci_dry_run):
    # the ci profile's cost.threads: its own, else the default config's
    ci, default = (yaml.safe_load((REPO / f).read_text()) for f in (CI_CONFIG, "config/config.yaml"))
    want = max((ci.get("cost") or {}).get("threads") or default["cost"]["threads"])
    parts = {j["rule"].removeprefix("cost_"): j for j in _jobs(ci_dry_run) if j["rule"].startswith("cost_")}
    assert set(parts) == {"serial", "threads"}
    assert want >= 2 and int(parts["threads"]["resources"]["cpus_per_task"]) == want
    assert int(parts["serial"]["resources"]["cpus_per_task"]) == 1
    merge = [j for j in _jobs(ci_dry_run) if j["rule"] == "cost"]
    assert len(merge) == 1 and int(merge[0]["resources"]["cpus_per_task"]) == 1


def test_gpu_profile_is_the_base_profile_plus_gpus():
    base, gpu = _load(PROFILE), _load(GPU_PROFILE)
    assert gpu.pop("config") == ["device=cuda"]
    assert gpu["default-resources"].pop("gpu") == 1
    assert gpu == base, "workflow/profiles/slurm/gpu/config.yaml drifted from ../config.yaml"


def test_gpu_profile_dry_run_asks_for_gpus():
    out = _dry_run(GPU_PROFILE)
    remote = [j for j in _jobs(out) if not j["local"] and j["rule"] != "all"]
    assert remote and all(j["resources"].get("gpu") == "1" for j in remote), remote
