# The studies of the page: L2-legacy sensitivity (one job per operating point, then the merge),
# the optimisation demo, the placement toy and the neural proxy. Their config sections are
# validated with the rest of the config (workflow/schemas/config.schema.yaml).
# A study that imports another study's script lists that script as an input.
SENSITIVITY_OPS = [op["name"] for op in config["sensitivity"]["ops"]]


rule sensitivity_op:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        calibration=ARTIFACTS["calibration"],
    output:
        json=f"{RESULTS}/sensitivity/op_{{op}}.json",
    params:
        **stage_params("sensitivity"),
        part=lambda wc: f"op-{wc.op}",
    wildcard_constraints:
        op="|".join(SENSITIVITY_OPS),
    log:
        f"{RESULTS}/logs/sensitivity_op_{{op}}.log",
    benchmark:
        f"{RESULTS}/bench/sensitivity_op_{{op}}.tsv"
    threads: config["threads"]
    priority: PRIORITY["sensitivity"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/sensitivity.py"


rule sensitivity:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        calibration=ARTIFACTS["calibration"],
        parts=expand(f"{RESULTS}/sensitivity/op_{{op}}.json", op=SENSITIVITY_OPS),
    output:
        **TABLES["sensitivity"],
        json=report(ARTIFACTS["sensitivity"], caption="../report/sensitivity.rst", category="sensitivity"),
        figure=report(
            f"{RESULTS}/sensitivity.png", caption="../report/sensitivity.rst", category="sensitivity"
        ),
    params:
        **stage_params("sensitivity"),
        part="merge",
    log:
        log_path("sensitivity"),
    benchmark:
        bench_path("sensitivity")
    threads: config["threads"]
    priority: PRIORITY["sensitivity"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/sensitivity.py"


rule opt_rates:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        scripts=["benchmarks/diff/_optimise.py"],
        calibration=ARTIFACTS["calibration"],
        proxy=f"{RESULTS}/nn_proxy.pt",
    output:
        **TABLES["opt_rates"],
        json=report(ARTIFACTS["opt_rates"], caption="../report/opt_rates.rst", category="opt_rates"),
        figure=report(f"{RESULTS}/opt_rates.png", caption="../report/opt_rates.rst", category="opt_rates"),
    params:
        **stage_params("opt_rates"),
    log:
        log_path("opt_rates"),
    benchmark:
        bench_path("opt_rates")
    threads: config["threads"]
    priority: PRIORITY["opt_rates"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/opt_rates.py"


rule placement:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        scripts=["benchmarks/diff/_optimise.py"],
        calibration=ARTIFACTS["calibration"],
        proxy=f"{RESULTS}/nn_proxy.pt",
    output:
        **TABLES["placement"],
        json=report(ARTIFACTS["placement"], caption="../report/placement.rst", category="placement"),
        figure=report(f"{RESULTS}/placement.png", caption="../report/placement.rst", category="placement"),
    params:
        **stage_params("placement"),
    log:
        log_path("placement"),
    benchmark:
        bench_path("placement")
    threads: config["threads"]
    priority: PRIORITY["placement"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/placement.py"


rule nn_proxy:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        **TABLES["nn_proxy"],
        json=report(ARTIFACTS["nn_proxy"], caption="../report/nn_proxy.rst", category="nn_proxy"),
        figure=report(f"{RESULTS}/nn_proxy.png", caption="../report/nn_proxy.rst", category="nn_proxy"),
        model=f"{RESULTS}/nn_proxy.pt",
    params:
        **stage_params("nn_proxy"),
    log:
        log_path("nn_proxy"),
    benchmark:
        bench_path("nn_proxy")
    threads: config["threads"]
    priority: PRIORITY["nn_proxy"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/nn_proxy.py"
