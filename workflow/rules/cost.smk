COST_THREADS = [str(n) for n in config["cost"]["threads"]]


# One job per torch thread count: it reserves that many cores, so the one-thread rows (the
# speed-ups, the baselines, the discrete levels) run beside other one-thread jobs and only the
# multi-thread rows hold the cores they measure. The compile warm-up's first calls are measured
# by the job that reserves the most (cost.py: a first call has the box to itself).
rule cost_part:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=f"{RESULTS}/cost/threads_{{threads}}.json",
    params:
        **stage_params("cost"),
        part=lambda wc: f"threads-{wc.threads}",
    wildcard_constraints:
        threads="|".join(COST_THREADS),
    log:
        f"{RESULTS}/logs/cost_part_{{threads}}.log",
    benchmark:
        f"{RESULTS}/bench/cost_part_{{threads}}.tsv"
    threads: lambda wc: int(wc.threads)
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/cost.py"


rule cost:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        parts=expand(f"{RESULTS}/cost/threads_{{threads}}.json", threads=COST_THREADS),
    output:
        json=report(ARTIFACTS["cost"], caption="../report/cost.rst", category="cost"),
    params:
        **stage_params("cost"),
        part="merge",
    log:
        log_path("cost"),
    benchmark:
        bench_path("cost")
    threads: 1
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/cost.py"
