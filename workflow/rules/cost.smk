rule cost:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        **TABLES["cost"],
        json=report(ARTIFACTS["cost"], caption="../report/cost.rst", category="cost"),
    params:
        **stage_params("cost"),
    log:
        log_path("cost"),
    benchmark:
        bench_path("cost")
    # The stage sweeps torch threads itself; reserve the most it uses.
    threads: max(config["cost"]["threads"])
    priority: PRIORITY["cost"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/cost.py"
