#!/usr/bin/env bash
# Run the isaac_net pipeline through Snakemake's SLURM executor on a throwaway,
# real, single-node SLURM cluster, and check it against a plain local run.
#
#   bash tests/slurm/run_local_cluster.sh              # the ci profile, end to end
#   bash tests/slurm/run_local_cluster.sh --selftest   # a two-rule toy workflow only
#   bash tests/slurm/run_local_cluster.sh --keep-state # keep the temp dir for a post-mortem
#
# What it does (see docs/slurm.md):
#   1. installs slurmctld/slurmd/slurm-client/munge (apt, only if missing) and
#      snakemake-executor-plugin-slurm into the project's venv (only if missing);
#   2. starts munged, slurmctld and slurmd with every file (key, socket, config,
#      state, spool, logs, pid files) under one temp dir, on free TCP ports; nothing
#      under /etc is touched. Clients find the cluster through $SLURM_CONF;
#   3. snapshots the working tree (tracked + untracked, not ignored files) into two
#      copies under the temp dir: "slurm" and "local", so neither touches the results
#      (benchmarks/diff/results/) of the checkout nor clashes with a local ci run;
#   4. runs the ci pipeline in "slurm" through `--workflow-profile
#      workflow/profiles/slurm` and, at the same time, in "local" with --cores;
#   5. checks every non-local rule ran as a COMPLETED SLURM job (slurmctld's job
#      completion log + the plugin's kept .snakemake/slurm_logs) and that the JSON
#      artifacts of both runs hold the same measured values (provenance and timing
#      keys excluded, see tests/slurm/compare_results.py);
#   6. tears the cluster down (trap on EXIT): scancel, then the daemons by pid file.
#
# Environment knobs: VENV (default <repo>/.venv), SLURM_TEST_CONFIGFILE
# (default config/ci.yaml), SLURM_TEST_TARGET (default report),
# SLURM_TEST_LOCAL_CORES (default 1), SLURM_TEST_TIMEOUT (seconds per run, default 1800: a guard against a hung run; the
# local run on one core, beside the SLURM run on the same 2 cores, took about 9 min once the
# calibration fanned out into a job per model and fleet size, and more than 15 min on a box 2.75 times
# slower, docs/design.md section 7).
set -euo pipefail

T0=$(date +%s)
MODE=pipeline
KEEP_STATE=0
for arg in "$@"; do
    case "$arg" in
        --selftest) MODE=selftest ;;
        --keep-state) KEEP_STATE=1 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${VENV:-$REPO/.venv}
CONFIGFILE=${SLURM_TEST_CONFIGFILE:-config/ci.yaml}
TARGET=${SLURM_TEST_TARGET:-report}
LOCAL_CORES=${SLURM_TEST_LOCAL_CORES:-1}
TIMEOUT=${SLURM_TEST_TIMEOUT:-1800}
PARTITION=debug
HOST=$(hostname -s)
NCPU=$(nproc)

log() { printf '[slurm-test %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { log "FAIL: $*"; exit 1; }

# --------------------------------------------------------------------------- 1. install
step_install() {
    local missing=0 b
    for b in munged munge unmunge slurmctld slurmd sbatch squeue sinfo scontrol scancel; do
        command -v "$b" >/dev/null 2>&1 || missing=1
    done
    if [ "$missing" = 1 ]; then
        [ "$(id -u)" = 0 ] || die "SLURM/munge missing and not root: apt-get install slurmctld slurmd slurm-client munge"
        log "installing slurmctld slurmd slurm-client munge (apt)"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
    else
        log "SLURM and munge already installed ($(slurmctld -V))"
    fi
    # The Debian packages start nothing here (no systemd), but if a packaged
    # service did start, it would use /etc and the default ports; we use neither.
    [ -x "$VENV/bin/snakemake" ] || die "no snakemake in $VENV (set VENV=...)"
    if ! "$VENV/bin/python" -c 'import snakemake_executor_plugin_slurm' 2>/dev/null; then
        log "pip-installing snakemake-executor-plugin-slurm into $VENV"
        "$VENV/bin/python" -m pip install -q snakemake-executor-plugin-slurm
    else
        log "snakemake-executor-plugin-slurm already in $VENV ($("$VENV/bin/python" -c \
            'import importlib.metadata as m; print(m.version("snakemake-executor-plugin-slurm"))'))"
    fi
}

# --------------------------------------------------------------------------- 2. cluster
STATE=""
LOCAL_PID=""
SLURM_PID=""
cleanup() {
    local rc=$?
    set +e
    # a run's `timeout` passes the signal on to its snakemake, which cancels its jobs
    local p
    for p in $SLURM_PID $LOCAL_PID; do kill "$p" 2>/dev/null; done
    for p in $SLURM_PID $LOCAL_PID; do
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    done
    if [ -n "$STATE" ] && [ -f "$STATE/slurm.conf" ]; then
        if [ -f "$STATE/slurmctld.pid" ]; then
            SLURM_CONF="$STATE/slurm.conf" timeout 10 scancel --full --quiet --partition="$PARTITION" 2>/dev/null
        fi
        local f pid
        for f in slurmd.pid slurmctld.pid munge/munged.pid; do
            [ -f "$STATE/$f" ] || continue
            pid=$(cat "$STATE/$f" 2>/dev/null)
            [ -n "$pid" ] || continue
            kill "$pid" 2>/dev/null
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
        done
        if [ "$rc" != 0 ]; then
            log "--- tail of slurmctld.log / slurmd.log (failure context) ---"
            tail -n 15 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" 2>/dev/null
        fi
        log "cluster torn down (daemons stopped by pid file)"
    fi
    if [ -n "$STATE" ] && [ -d "$STATE" ]; then
        if [ "$KEEP_STATE" = 1 ] || [ "$rc" != 0 ]; then
            log "state kept for inspection: $STATE"
        else
            rm -rf "$STATE"
        fi
    fi
    log "total wall time: $(( $(date +%s) - T0 )) s"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1]); s.close()'
}

step_cluster() {
    STATE=$(mktemp -d /tmp/isaac-slurm.XXXXXX)
    chmod 755 "$STATE"
    mkdir -p "$STATE/munge" "$STATE/state" "$STATE/spool" "$STATE/log"
    chmod 700 "$STATE/munge"
    log "state dir: $STATE"

    # munge: own key, socket, pid and log; slurm is pointed at the socket via AuthInfo.
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$STATE/munge/munge.key"
    local sock="$STATE/munge/munge.sock"
    munged --force --key-file="$STATE/munge/munge.key" --socket="$sock" \
        --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed" 2>>"$STATE/log/munged.stderr" \
        || die "munged did not start ($(cat "$STATE/log/munged.stderr"))"
    munge -S "$sock" -n | unmunge -S "$sock" >/dev/null || die "munge round trip failed"

    local mem_mb ctld_port d_port
    # RealMemory: 80 % of the RAM, but at least 32 GB so that the profile's per-stage
    # mem_mb requests (sized for the full profile) fit on a small test box; the ci stages
    # use a few hundred MB. config_overrides keeps slurmd from draining the node then.
    mem_mb=$(awk '/MemTotal/ {m = $2/1024*0.8; if (m < 32768) m = 32768; printf "%d", m}' /proc/meminfo)
    ctld_port=$(free_port); d_port=$(free_port)
    while [ "$d_port" = "$ctld_port" ]; do d_port=$(free_port); done
    cat >"$STATE/slurm.conf" <<EOF
# throwaway single-node cluster written by tests/slurm/run_local_cluster.sh
ClusterName=isaacnet
SlurmctldHost=$HOST
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=3600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$HOST CPUs=$NCPU RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$STATE/slurm.conf"
    # Client commands find the cluster through $SLURM_CONF, but the plugin's job step
    # (snakemake-executor-plugin-slurm-jobstep) drops every SLURM_* variable before its
    # nested `srun`, which then looks for /etc/slurm/slurm.conf. Rather than writing to
    # /etc, put thin wrappers that pin SLURM_CONF first on PATH (PATH is passed on).
    mkdir -p "$STATE/bin"
    local tool
    for tool in srun sbatch squeue sinfo scontrol scancel sacct; do
        command -v "$tool" >/dev/null 2>&1 || continue
        printf '#!/bin/sh\nSLURM_CONF=%s exec %s "$@"\n' "$SLURM_CONF" "$(command -v "$tool")" >"$STATE/bin/$tool"
        chmod 755 "$STATE/bin/$tool"
    done
    export PATH="$STATE/bin:$PATH"
    slurmctld -f "$SLURM_CONF" || die "slurmctld did not start"
    slurmd -f "$SLURM_CONF" || die "slurmd did not start"
    local state="" i
    for i in $(seq 1 60); do
        state=$(sinfo -h -N -o '%T' 2>/dev/null | head -n1)
        case "$state" in idle|idle*|mixed*) break ;; esac
        sleep 0.5
    done
    case "$state" in idle*|mixed*) ;; *) die "node not idle after 30 s (state '$state')" ;; esac
    log "cluster up: node $HOST ($NCPU CPUs, ${mem_mb} MB), partition $PARTITION, ctld port $ctld_port"
    local out
    out=$(timeout 60 srun -N1 -n1 bash -c 'echo "$SLURM_JOB_ID $(hostname -s)"') || die "srun smoke job failed"
    log "srun smoke job ok (job id / node: $out)"
}

# --------------------------------------------------------------------------- 3. copies
snapshot() {  # copy tracked + untracked-not-ignored files of the checkout to $1
    local dest=$1
    mkdir -p "$dest"
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
        | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _ \
        | tar --null -T - -cf -) | tar -xf - -C "$dest"
}

write_selftest_workflow() {  # a two-rule workflow with the same profile layout
    local dest=$1
    mkdir -p "$dest/workflow/profiles/slurm" "$dest/config"
    cat >"$dest/workflow/Snakefile" <<'EOF'
configfile: "config/ci.yaml"
localrules: report

rule report:
    input: "results/ci/b.json"
    output: "results/ci/report.md"
    shell: "python -c \"import json; d=json.load(open('{input}')); open('{output}','w').write('# toy ci\\nvalue: %s\\n' % d['value'])\""

rule b:
    input: "results/ci/a.json"
    output: "results/ci/b.json"
    resources: runtime=5, mem_mb=200
    shell: "python -c \"import json,os; a=json.load(open('{input}')); json.dump({{'value': a['value']*2, 'slurm_job_id': os.environ.get('SLURM_JOB_ID'), 'wall_s': 0.1}}, open('{output}','w'))\""

rule a:
    output: "results/ci/a.json"
    resources: runtime=5, mem_mb=200
    shell: "python -c \"import json,os; json.dump({{'value': {config[seed]} + 0.5, 'slurm_job_id': os.environ.get('SLURM_JOB_ID'), 'wall_s': 0.2}}, open('{output}','w'))\""
EOF
    echo "seed: 20" >"$dest/config/ci.yaml"
    cat >"$dest/workflow/profiles/slurm/config.yaml" <<EOF
executor: slurm
jobs: 4
default-resources:
  runtime: 5
  mem_mb: 200
slurm-status-command: squeue
slurm-keep-successful-logs: true
EOF
}

# --------------------------------------------------------------------------- 4. runs
SNAKEMAKE_COMMON=()
step_runs() {
    local slurm_dir="$STATE/work/slurm" local_dir="$STATE/work/local"
    if [ "$MODE" = selftest ]; then
        write_selftest_workflow "$slurm_dir"; write_selftest_workflow "$local_dir"
    else
        snapshot "$slurm_dir"; snapshot "$local_dir"
        [ -f "$slurm_dir/$CONFIGFILE" ] || die "$CONFIGFILE not in the working tree (is the pipeline there yet?)"
    fi
    [ -f "$slurm_dir/workflow/profiles/slurm/config.yaml" ] || die "workflow/profiles/slurm/config.yaml missing"
    log "working-tree snapshots: $slurm_dir , $local_dir"
    sleep 1; touch "$STATE/work/.runs-started"   # compare only files written after this

    export PATH="$VENV/bin:$PATH"
    # Same code in both runs, and it is the snapshot's code, not the editable install's.
    export PYTHONHASHSEED=0 CUDA_VISIBLE_DEVICES=""
    SNAKEMAKE_COMMON=(--configfile "$CONFIGFILE" --nolock --rerun-incomplete)

    # the local run competes for the same 2 cores, so it gets --cores $LOCAL_CORES
    # and runs while the SLURM run mostly waits on the scheduler and status polls.
    log "local run (--cores $LOCAL_CORES) started in background"
    ( cd "$local_dir" && export PYTHONPATH="$local_dir${PYTHONPATH:+:$PYTHONPATH}" \
        && exec timeout "$TIMEOUT" snakemake --cores "$LOCAL_CORES" "${SNAKEMAKE_COMMON[@]}" "$TARGET" \
        ) >"$STATE/log/local-run.log" 2>&1 &
    LOCAL_PID=$!

    log "SLURM run: snakemake --workflow-profile workflow/profiles/slurm ${SNAKEMAKE_COMMON[*]} $TARGET"
    local t1 rc=0
    t1=$(date +%s)
    # in the background and waited for, so that a signal reaches the trap at once
    ( cd "$slurm_dir" && export PYTHONPATH="$slurm_dir${PYTHONPATH:+:$PYTHONPATH}" \
        && exec timeout "$TIMEOUT" snakemake --workflow-profile workflow/profiles/slurm \
            "${SNAKEMAKE_COMMON[@]}" \
            --slurm-init-seconds-before-status-checks 3 \
            --slurm-status-command squeue --slurm-keep-successful-logs \
            "$TARGET" ) >"$STATE/log/slurm-run.log" 2>&1 &
    SLURM_PID=$!
    wait "$SLURM_PID" || rc=$?
    SLURM_PID=""
    SLURM_RUN_S=$(( $(date +%s) - t1 ))
    if [ "$rc" != 0 ]; then
        tail -n 40 "$STATE/log/slurm-run.log"
        die "SLURM run failed (rc=$rc, log $STATE/log/slurm-run.log)"
    fi
    log "SLURM run finished in ${SLURM_RUN_S} s"
    rc=0
    wait "$LOCAL_PID" || rc=$?
    LOCAL_PID=""
    if [ "$rc" != 0 ]; then
        tail -n 40 "$STATE/log/local-run.log"
        die "local run failed (rc=$rc, log $STATE/log/local-run.log)"
    fi
    log "local run finished"
}

# --------------------------------------------------------------------------- 5. checks
step_checks() {
    local slurm_dir="$STATE/work/slurm" local_dir="$STATE/work/local"
    # rules snakemake sent to SLURM: one "Job N has been submitted with SLURM jobid X" per job
    "$VENV/bin/python" "$REPO/tests/slurm/check_slurm_jobs.py" \
        --run-log "$STATE/log/slurm-run.log" \
        --jobcomp "$STATE/log/jobcomp.txt" \
        --slurm-logs "$slurm_dir/.snakemake/slurm_logs" \
        --summary "$STATE/log/jobs-summary.txt" \
        || die "SLURM job evidence check failed"
    cat "$STATE/log/jobs-summary.txt"
    squeue -h -t all -o '%.8i %.10T %.30k' >"$STATE/log/squeue-all.txt" 2>/dev/null || true
    "$VENV/bin/python" "$REPO/tests/slurm/compare_results.py" "$local_dir" "$slurm_dir" \
        --newer-than "$STATE/work/.runs-started" \
        || die "SLURM and local results differ"
}

step_install
step_cluster
step_runs
step_checks
log "PASS: the ${MODE} workflow ran through the SLURM executor on a real single-node cluster and matches the local run"
