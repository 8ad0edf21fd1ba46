# Calibration of L1D and QAD (mean-field, relaxed) to L2-legacy (benchmarks/diff/calibrate.py):
# L2-legacy targets per point set and fleet size and one fit per model run as separate jobs, side
# by side under --cores N or SLURM; the merge writes the calibration file the studies read.
CALIBRATION_SETS = ("train", "heldout", "sweep")
CALIBRATION_MODELS = [f"{m}_{s}" for m in config["calibrate"]["modes"] for s in config["calibrate"]["sends"]]
CALIBRATION_DIR = f"{RESULTS}/calibrate"


rule calibrate_targets:
    input:
        library=LIBRARY,
        helpers=HELPERS,
    output:
        json=f"{CALIBRATION_DIR}/targets_{{set}}_R{{R}}.json",
    params:
        **stage_params(
            "calibrate", drop=["search", "modes", "sends", "tau", "lam", "model_envs", "slope_weight"]
        ),
        part=lambda wc: f"targets-{wc.set}-{wc.R}",
    wildcard_constraints:
        set="|".join(CALIBRATION_SETS),
        R="|".join(str(r) for r in CALIBRATION_R),
    log:
        f"{RESULTS}/logs/calibrate_targets_{{set}}_R{{R}}.log",
    benchmark:
        f"{RESULTS}/bench/calibrate_targets_{{set}}_R{{R}}.tsv"
    threads: config["threads"]
    priority: PRIORITY["calibrate"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/calibrate.py"


rule calibrate_fit:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        train=calibration_targets("train"),
        heldout=calibration_targets("heldout"),
    output:
        json=f"{CALIBRATION_DIR}/fit_{{model}}.json",
    params:
        **stage_params("calibrate", drop=["modes", "sends"]),
        part=lambda wc: f"fit-{wc.model}",
    wildcard_constraints:
        model="|".join(CALIBRATION_MODELS),
    log:
        f"{RESULTS}/logs/calibrate_fit_{{model}}.log",
    benchmark:
        f"{RESULTS}/bench/calibrate_fit_{{model}}.tsv"
    threads: config["threads"]
    priority: PRIORITY["calibrate"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/calibrate.py"


rule calibrate:
    input:
        library=LIBRARY,
        helpers=HELPERS,
        fits=expand(f"{CALIBRATION_DIR}/fit_{{model}}.json", model=CALIBRATION_MODELS),
        sweep=calibration_targets("sweep"),
    output:
        **TABLES["calibration"],
        json=report(ARTIFACTS["calibration"], caption="../report/calibration.rst", category="calibration"),
        figure=report(
            f"{RESULTS}/calibration.png", caption="../report/calibration.rst", category="calibration"
        ),
    params:
        **stage_params("calibrate"),
        part="merge",
    log:
        log_path("calibrate"),
    benchmark:
        bench_path("calibrate")
    threads: 1
    priority: PRIORITY["calibrate"]
    conda:
        "../../environment.yml"
    script:
        "../../benchmarks/diff/calibrate.py"
