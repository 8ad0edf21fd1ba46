rule gradcheck:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=ARTIFACTS["gradcheck"],
    params:
        **stage_params("gradcheck", drop=["fd"]),
        part="gradcheck",
    log:
        log_path("gradcheck"),
    benchmark:
        bench_path("gradcheck")
    threads: config["threads"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/gradcheck.py"


rule fd_check:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=ARTIFACTS["fd_check"],
        figure=f"{RESULTS}/fd_check.png",
    params:
        **stage_params("gradcheck", drop=["small"]),
        part="fd",
    log:
        log_path("fd_check"),
    benchmark:
        bench_path("fd_check")
    threads: config["threads"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/gradcheck.py"
