rule convergence_table:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        **TABLES["convergence"],
        json=report(ARTIFACTS["convergence"], caption="../report/convergence.rst", category="convergence"),
    params:
        **stage_params("convergence", drop=["curves"]),
        part="table",
    log:
        log_path("convergence_table"),
    benchmark:
        bench_path("convergence_table")
    threads: config["threads"]
    priority: PRIORITY["checks"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/convergence.py"


rule convergence_curves:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        **TABLES["convergence_curves"],
        json=report(
            ARTIFACTS["convergence_curves"],
            caption="../report/convergence_curves.rst",
            category="convergence_curves",
        ),
        figure=report(
            f"{RESULTS}/convergence_curves.png",
            caption="../report/convergence_curves.rst",
            category="convergence_curves",
        ),
    params:
        **stage_params("convergence", drop=["table", "default_tau"]),
        part="curves",
    log:
        log_path("convergence_curves"),
    benchmark:
        bench_path("convergence_curves")
    threads: config["threads"]
    priority: PRIORITY["checks"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/convergence.py"
