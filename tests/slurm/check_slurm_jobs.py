"""Evidence that a Snakemake run's jobs really ran as SLURM jobs.

Used by tests/slurm/run_local_cluster.sh after the SLURM run. Three independent sources:

* the Snakemake log: every non-local job is announced as ``rule <name>:`` and, with the
  SLURM executor, ``Job N has been submitted with SLURM jobid X (log: .../rule_<name>/...)``;
  local rules appear as ``localrule <name>:``;
* slurmctld's job completion log (``JobCompType=jobcomp/filetxt``): one
  ``JobId=X ... JobState=COMPLETED ... ExitCode=0:0`` line per finished job;
* the plugin's per-job logs under ``.snakemake/slurm_logs/rule_<name>/…/<X>.log``
  (kept with ``--slurm-keep-successful-logs``).

Passes when every non-local job of the run was submitted to SLURM, every submitted job
id is COMPLETED with exit code 0 in the completion log, and each has its log file.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

SUBMIT_RE = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.?\s*$")
RULE_RE = re.compile(r"^\s*(local)?rule (\w+):\s*$")
RULE_DIR_RE = re.compile(r"(?:^|/)rule_(\w+?)(?:/|$)")


def parse_run_log(text: str):
    rules, localrules, submitted = Counter(), Counter(), []
    run_id = None
    for line in text.splitlines():
        if line.startswith("SLURM run ID:"):
            run_id = line.split(":", 1)[1].strip()
            continue
        m = RULE_RE.match(line)
        if m:
            (localrules if m.group(1) else rules)[m.group(2)] += 1
            continue
        m = SUBMIT_RE.search(line)
        if m:
            log_path = m.group(3)
            rm = RULE_DIR_RE.search(log_path.split("slurm_logs", 1)[-1])
            submitted.append(
                {
                    "sm_job": int(m.group(1)),
                    "slurm_id": m.group(2),
                    "log": log_path,
                    "rule": rm.group(1) if rm else "?",
                }
            )
    return rules, localrules, submitted, run_id


def parse_jobcomp(text: str) -> dict[str, dict[str, str]]:
    jobs = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "JobId" in fields:
            jobs[fields["JobId"]] = fields
    return jobs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-log", required=True, type=Path)
    ap.add_argument("--jobcomp", required=True, type=Path)
    ap.add_argument("--slurm-logs", required=True, type=Path)
    ap.add_argument("--summary", type=Path)
    args = ap.parse_args(argv)

    rules, localrules, submitted, run_id = parse_run_log(args.run_log.read_text(errors="replace"))
    jobcomp = parse_jobcomp(args.jobcomp.read_text(errors="replace")) if args.jobcomp.exists() else {}
    problems, lines = [], []

    if not submitted:
        problems.append("no job was submitted to SLURM")
    sub_rules = Counter(s["rule"] for s in submitted)
    if sub_rules != rules:
        problems.append(f"non-local jobs {dict(rules)} != jobs submitted to SLURM {dict(sub_rules)}")

    lines.append(f"SLURM run ID (the jobs' name): {run_id}")
    lines.append(f"{'rule':<20} {'slurm job':>9} {'state':<10} {'exit':<5} {'cpus':>4} {'node':<8} log")
    for s in sorted(submitted, key=lambda s: int(s["slurm_id"])):
        jc = jobcomp.get(s["slurm_id"], {})
        state, exit_code = jc.get("JobState", "MISSING"), jc.get("ExitCode", "?")
        log_ok = Path(s["log"]).exists()
        lines.append(
            f"{s['rule']:<20} {s['slurm_id']:>9} {state:<10} {exit_code:<5} {jc.get('ProcCnt', '?'):>4} "
            f"{jc.get('NodeList', '?'):<8} {'kept' if log_ok else 'MISSING'}"
        )
        if jc and run_id and jc.get("Name") != run_id:
            problems.append(
                f"SLURM job {s['slurm_id']} is named {jc.get('Name')!r}, not this run's {run_id!r}"
            )
        if state != "COMPLETED" or exit_code != "0:0":
            problems.append(f"SLURM job {s['slurm_id']} ({s['rule']}): state {state}, exit {exit_code}")
        if not log_ok:
            problems.append(f"SLURM log of job {s['slurm_id']} ({s['rule']}) missing: {s['log']}")
    if localrules:
        lines.append(
            "local rules (ran in the submitting snakemake, not as SLURM jobs): "
            + ", ".join(f"{r} x{n}" if n > 1 else r for r, n in sorted(localrules.items()))
        )
    n_logs = len(list(args.slurm_logs.rglob("*.log"))) if args.slurm_logs.exists() else 0
    lines.append(
        f"SLURM jobs submitted: {len(submitted)}; completion records: {len(jobcomp)}; "
        f"plugin logs under {args.slurm_logs}: {n_logs}"
    )
    for p in problems:
        lines.append(f"PROBLEM: {p}")
    text = "\n".join(lines) + "\n"
    if args.summary:
        args.summary.write_text(text)
    else:
        sys.stdout.write(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
