#!/usr/bin/env bash
# Run the "Checks and measurements" pipeline: every stage that is pending or changed, then the page.
# Arguments go to snakemake unchanged, e.g.
#   benchmarks/diff/run_all.sh                                   # full profile, all cores
#   benchmarks/diff/run_all.sh --cores 2 --configfile config/ci.yaml
#   benchmarks/diff/run_all.sh -n                                # dry run: what would run, and why
# Without --cores/-c/--jobs/-j it uses every core of the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
snakemake=snakemake
[ -x .venv/bin/snakemake ] && snakemake=.venv/bin/snakemake
cores=(--cores all)
for arg in "$@"; do
    case "$arg" in
        --cores|--cores=*|-c|-c*|--jobs|--jobs=*|-j|-j*) cores=() ;;
    esac
done
# The target comes first: --configfile takes several files and would swallow it.
exec "$snakemake" report "${cores[@]}" "$@"
