rule gradcheck:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        **TABLES["gradcheck"],
        json=report(ARTIFACTS["gradcheck"], caption="../report/gradcheck.rst", category="gradcheck"),
    params:
        **stage_params("gradcheck", drop=["fd"]),
        part="gradcheck",
    log:
        log_path("gradcheck"),
    benchmark:
        bench_path("gradcheck")
    threads: config["threads"]
    priority: PRIORITY["checks"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/gradcheck.py"


rule fd_check:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        **TABLES["fd_check"],
        json=report(ARTIFACTS["fd_check"], caption="../report/fd_check.rst", category="fd_check"),
        figure=report(f"{RESULTS}/fd_check.png", caption="../report/fd_check.rst", category="fd_check"),
    params:
        **stage_params("gradcheck", drop=["small"]),
        part="fd",
    log:
        log_path("fd_check"),
    benchmark:
        bench_path("fd_check")
    threads: config["threads"]
    priority: PRIORITY["checks"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/gradcheck.py"
