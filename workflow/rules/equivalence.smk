rule equivalence:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        **TABLES["equivalence"],
        json=report(ARTIFACTS["equivalence"], caption="../report/equivalence.rst", category="equivalence"),
    params:
        **stage_params("equivalence"),
    log:
        log_path("equivalence"),
    benchmark:
        bench_path("equivalence")
    threads: config["threads"]
    priority: PRIORITY["checks"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/equivalence.py"
