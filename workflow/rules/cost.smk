COST_THREADS = [str(n) for n in config["cost"]["threads"]]


# One job per torch thread count (cost.py's parts; the compile warm-up's first calls go with
# the largest). Each reserves the most cores the stage measures with, as the single job did:
# on a box of two cores a one-thread row measured beside another stage ran up to 1.75x slower
# (and not by the same factor as the rows it is compared with), so the parts measure with the
# box to themselves there and side by side only where there are cores to spare.
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
    threads: max(config["cost"]["threads"])
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
