rule convergence_table:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=ARTIFACTS["convergence"],
    params:
        **stage_params("convergence", drop=["curves"]),
        part="table",
    log:
        log_path("convergence_table"),
    benchmark:
        bench_path("convergence_table")
    threads: config["threads"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/convergence.py"


rule convergence_curves:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=ARTIFACTS["convergence_curves"],
        figure=f"{RESULTS}/convergence_curves.png",
    params:
        **stage_params("convergence", drop=["table", "default_tau"]),
        part="curves",
    log:
        log_path("convergence_curves"),
    benchmark:
        bench_path("convergence_curves")
    threads: config["threads"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/convergence.py"
