"""The pipeline (Snakefile, config profiles, reports/): rendering from artifacts, schema
errors, the number check, the jobs of each profile, and what a changed setting reruns.

The snakemake tests run in a temporary copy of the workflow whose stage scripts are
replaced by stubs that write the fixture artifacts below, so they need no torch work.
"""

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "reports"))

import check_numbers  # noqa: E402
import render  # noqa: E402

SNAKEMAKE = Path(sys.executable).with_name("snakemake")
PROFILES = {"full": "config/config.yaml", "smoke": "config/smoke.yaml", "ci": "config/ci.yaml"}
STAGE_JOBS = {"equivalence", "convergence_table", "convergence_curves", "gradcheck", "fd_check", "cost",
              "sensitivity", "opt_rates", "placement", "nn_proxy"}
STUDIES = ("sensitivity", "opt_rates", "placement", "nn_proxy")


# ------------------------------------------------------------------------------ fixtures
def _prov(stage: str, config: dict) -> dict:
    return {
        "stage": stage, "profile": "fixture", "config": config, "seeds": {"seed": 7},
        "git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": False,
        "python": "3.11.7", "torch": "2.13.0+cpu", "device": "cpu", "torch_threads": 1,
        "cpu_model": "Fixture CPU", "load_avg_start": [0.25, 0.2, 0.1], "load_avg_end": [0.75, 0.3, 0.2],
        "wall_s": 12.5,
    }


def fixture_artifacts() -> dict[str, dict]:
    """One artifact per stage with distinctive numbers (the generic one for sensitivity)."""
    eq_cfg = {"seed": 7, "E": 8, "R": 6, "T": 50, "tol": 1e-4, "cases": {
        "normal": {"p": 0.4, "sizes_bytes": [4000, 30000], "snr_db": [10.0, 30.0], "cell": {}},
        "overload": {"p": 0.9, "sizes_bytes": [30000, 60000], "snr_db": [0.0, 15.0],
                     "cell": {"buffer_msgs": 4, "timeout_steps": 6}}}}
    eq_rows = []
    for case, (F, A, binds) in {"normal": (8, 10, False), "overload": (4, 6, True)}.items():
        for mode, pair in (("L1", "L1D vs L1"), ("QA", "QAD vs QA")):
            eq_rows.append({"case": case, "mode": mode, "pair": pair, "p": eq_cfg["cases"][case]["p"],
                            "max_abs_delivered": 0.0, "max_abs_timeouts": 0.0, "max_abs_overflow": 0.0,
                            "max_abs_aoi": 0.0, "max_abs_queued_msgs": 0.0, "max_rel_delay_sum": 3.3e-16,
                            "max_rel_energy": 0.0, "offered": 137.0, "delivered": 91.0,
                            "timeouts": 23.0 if binds else 0.0, "overflow": 17.0 if binds else 0.0,
                            "buffer_msgs": F, "timeout_steps": A, "binds": binds, "pass": True})
    equivalence = {"summary": {"tau": 0.0, "tol": 1e-4, "all_pass": True, "max_abs_count_diff": 0.0,
                               "max_rel_delay_sum": 3.3e-16},
                   "table": eq_rows, "provenance": _prov("equivalence", eq_cfg)}

    taus = [0.0, 0.2, 0.05, 0.002]
    conv_rows = []
    for t in taus:
        row = {"tau": t}
        for m, base, aoi in (("L1", 0.382, 2.501), ("QA", 0.638, 2.725)):
            row.update({f"{m}_mean_delay": base * (1 + 1.5 * t), f"{m}_mean_aoi": aoi * (1 + 0.6 * t),
                        f"{m}_delivery_ratio": 0.99, f"{m}_mean_delay_err_pct": 150.0 * t,
                        f"{m}_mean_aoi_err_pct": 60.0 * t, f"{m}_delivery_ratio_err_pct": 0.01 * t,
                        f"{m}_delay_bias": base * 1.5 * t})
        conv_rows.append(row)
    conv_summary = {"default_tau": 0.05, "tau_min": 0.002, "tau_max": 0.2, "max_delivery_err_pct": 0.002,
                    "delay_biased_up": True, "max_delay_err_pct_at_default": 7.5,
                    "max_delay_err_pct_at_min": 0.3, "min_delay_err_pct_at_max": 30.0}
    for m, base, aoi in (("L1", 0.382, 2.501), ("QA", 0.638, 2.725)):
        conv_summary.update({f"{m}_discrete_delay": base, f"{m}_discrete_aoi": aoi,
                             f"{m}_discrete_delivery": 0.99, f"{m}_tau0_delay_err_pct": 0.0,
                             f"{m}_delay_err_pct_at_default": 7.5, f"{m}_delay_err_pct_at_min": 0.3,
                             f"{m}_delay_err_pct_at_max": 30.0, f"{m}_aoi_err_pct_at_default": 3.0,
                             f"{m}_delay_err_slope": 1.0,
                             f"{m}_delay_err_trend": "falls roughly linearly in tau",
                             f"{m}_delay_biased_up": True, f"{m}_delay_bias_direction": "upward"})
    conv_cfg = {"seed": 7, "default_tau": 0.05, "table": {"E": 16, "R": 8, "T": 60, "p": 0.4,
                "sizes_bytes": [4000, 30000], "snr_db": [10.0, 30.0], "taus": taus}}
    convergence = {"summary": conv_summary, "table": conv_rows, "provenance": _prov("convergence", conv_cfg)}

    ctaus = [0.2, 0.05, 0.002]
    curves = [{"mode": m, "load": load, "discrete": 0.5, "taus": ctaus, "relaxed": [0.6, 0.53, 0.501],
               "err_pct": [20.0, 6.0, 0.2], "slope": 1.05} for load in (0.2, 0.4, 0.6) for m in ("L1", "QA")]
    curves_cfg = {"seed": 7, "curves": {"E": 64, "R": 8, "T": 200, "loads": [0.2, 0.4, 0.6],
                                        "sizes_bytes": [4000, 30000], "snr_db": [10.0, 30.0], "taus": ctaus}}
    convergence_curves = {
        "summary": {"min_slope": 1.05, "max_slope": 1.05, "max_err_pct_at_min_tau": 0.2, "tau_min": 0.002,
                    "delay_biased_up": True},
        "table": [{"mode": c["mode"], "load": c["load"]} for c in curves], "curves": curves,
        "figure": "convergence_curves.png", "provenance": _prov("convergence_curves", curves_cfg)}

    gc_rows = [{"mode": m, "kpi": k, "input": i, "pass": True, "max_abs_gap": None, "max_grad": 1.0,
                "nonzero": True}
               for m in ("L1", "QA") for k in ("mean_delay", "delivery_ratio", "mean_aoi", "mean_energy_j")
               for i in ("p", "B", "tx", "pos")]
    gc_cfg = {"seed": 7, "tau": 0.05, "modes": ["L1", "QA"], "small": {
        "E": 2, "R": 3, "T": 4, "p": 0.5, "sizes_bytes": [4000, 30000], "deadline": 3.5,
        "cell": {"num_slots": 4, "qa_sr_slots": 1, "buffer_msgs": 3, "timeout_steps": 4},
        "eps": 1e-6, "atol": 1e-5, "rtol": 1e-3}}
    gradcheck = {"summary": {"tau": 0.05, "all_pass": True, "num_checks": 32, "num_pass": 32,
                             "num_nonzero": 29, "max_abs_gap": None, "num_slots": 4, "buffer_msgs": 3,
                             "timeout_steps": 4},
                 "table": gc_rows, "provenance": _prov("gradcheck", gc_cfg)}

    steps = [1e-2, 1e-3, 1e-4, 1e-5]
    fd_rows = [{"mode": m, "input": i, "autograd": 0.4321, "fd": [0.44, 0.4322, 0.4321, 0.4321],
                "rel_err": [0.017, 1.7e-4, 1.7e-6, 3.9e-6], "best_rel_err": 1.7e-6, "slope": 1.9}
               for m in ("L1", "QA") for i in ("p", "B", "tx", "pos")]
    expected_signs = (("mean_delay", "B", "+", 0.0123), ("mean_delay", "p", "+", 0.75),
                      ("mean_delay", "tx", "-", -0.0456), ("mean_energy_j", "tx", "+", 4.5e-5))
    signs = [{"mode": m, "kpi": k, "input": i, "expected": e, "grad_sum": g, "pass": True}
             for m in ("L1", "QA") for k, i, e, g in expected_signs]
    fd_cfg = {"seed": 7, "tau": 0.05, "modes": ["L1", "QA"], "fd": {
        "E": 32, "R": 8, "T": 60, "p": 0.4, "sizes_bytes": [4000, 30000], "cell": {"num_slots": 40},
        "steps": steps, "tol": 1e-4, "weights": {"mean_delay": 1.0, "mean_aoi": 0.5, "mean_energy_j": 50.0}}}
    fd_check = {"summary": {"tau": 0.05, "tol": 1e-4, "max_best_rel_err": 1.7e-6, "all_match": True,
                            "min_slope": 1.9, "max_slope": 1.9,
                            "min_slope_large": 2.0, "max_slope_large": 2.0,
                            "trend": "shrinks roughly quadratically with the step",
                            "step_max": 1e-2, "step_min": 1e-5, "max_err_at_step_max": 0.017,
                            "max_err_at_step_min": 3.9e-6, "signs_pass": True, "num_slots": 40},
                "table": [], "rows": fd_rows, "signs": signs, "steps": steps, "figure": "fd_check.png",
                "provenance": _prov("fd_check", fd_cfg)}

    cost_cfg = {"seed": 7, "tau": 0.05, "dtype": "float32", "p": 0.4, "sizes_bytes": [4000, 30000],
                "modes": ["L1", "QA"], "E": [16, 64], "R": 8,
                "T": 60, "compile": [False, True], "threads": [1, 2], "timeout_s": 900, "repeats": 2,
                "l2_legacy": True, "large": {"E": 1024, "T": 200}, "speedup_bar": 7,
                "targets_s": [{"model": "L1D", "variant": "compiled", "E": 16, "s": 0.1}],
                "seed_s": {"T": 60, "L1D_fwd_bwd": {"16": [10.8, 11.1], "64": [22.1, 16.5]},
                           "L2_legacy_fwd": 27.0}}
    row = {"model": "L1D", "device": "cpu", "R": 8, "T": 60, "threads": 1, "peak_cuda_mib": None,
           "available": True, "slots": "tape"}
    cost_rows = [
        {**row, "variant": "eager", "E": 16, "compile": False, "forward_s": 0.4, "backward_s": 0.5,
         "peak_rss_mib": 345.0, "seed_ratio": 24.3},
        {**row, "variant": "per-slot autograd", "E": 16, "compile": False, "forward_s": 0.8,
         "backward_s": 1.0,
         "peak_rss_mib": 351.0, "seed_ratio": 12.2},
        {**row, "variant": "compiled", "E": 64, "compile": True, "threads": 2, "available": False,
         "error": "timed out after 900 s", "seed_ratio": None},
    ]
    large = {**row, "variant": "eager", "E": 1024, "T": 200, "compile": False, "forward_s": 21.0,
             "backward_s": 24.8, "peak_rss_mib": 3310.0, "seed_ratio": None, "slots": "recompute"}
    speedups = [{"E": 16, "per_slot_autograd_s": 1.8, "eager_s": 0.9, "compiled_s": 0.12,
                 "eager_speedup": 2.0,
                 "compiled_speedup": 15.0}]
    cost = {"summary": {"dtype": "float32", "tau": 0.05, "num_slots": 40, "peak_rss_mib": 345.0,
                        "l2_legacy_available": False, "compile_available": False, "num_failed": 1,
                        "cuda_available": False},
            "table": cost_rows + [large], "speedups": speedups, "large": large,
            "targets": [{"model": "L1D", "variant": "compiled", "E": 16, "s": 0.1, "measured_s": 0.12,
                         "met": False}],
            "unavailable": {"L2-legacy": "ModuleNotFoundError: no l2_legacy"},
            "provenance": _prov("cost", cost_cfg)}

    sensitivity = {"summary": {"num_seeds": 2, "tx_grad_aoi": -0.79, "sign_agreement": 0.875},
                   "table": [{"input": "tx", "relaxed": -0.79, "l2_fd": -0.61}],
                   "provenance": _prov("sensitivity", {"seed": 7, "E": 16, "T": 60})}
    return {"equivalence": equivalence, "convergence": convergence, "convergence_curves": convergence_curves,
            "gradcheck": gradcheck, "fd_check": fd_check, "cost": cost, "sensitivity": sensitivity}


def study_artifact(name: str) -> dict:
    """The generic artifact of a study, with a figure."""
    return {"summary": {"score": 5.46}, "table": [{"case": "a", "value": 15.4}], "figure": f"{name}.png",
            "provenance": _prov(name, {"seed": 7})}


FIGURES = ("convergence_curves.png", "fd_check.png")


def write_artifacts(folder: Path, artifacts: dict) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:
        (folder / name).write_bytes(b"\x89PNG fixture")
    paths = {}
    for name in render.STAGES:
        paths[name] = str(folder / f"{name}.json")
        if name in artifacts:
            Path(paths[name]).write_text(json.dumps(artifacts[name]))
    return paths


def build_page(tmp_path: Path, artifacts: dict) -> str:
    paths = write_artifacts(tmp_path / "results", artifacts)
    pending = {name: f"snakemake --cores 32 {p}" for name, p in paths.items()}
    page = tmp_path / "page"
    return render.build(paths, pending, "fixture", page / "page.md", page / "figures")


def section(page: str, heading: str) -> str:
    """The text under one heading, up to the next heading of any level."""
    start = page.index(heading + "\n")
    nxt = re.search(r"^#", page[start + len(heading):], re.M)
    return page[start:start + len(heading) + nxt.start()] if nxt else page[start:]


# ------------------------------------------------------------------------------ rendering
def test_numbers_land_in_their_sections(tmp_path):
    page = build_page(tmp_path, fixture_artifacts())
    eq = section(page, "## Equivalence at tau = 0")
    assert "max difference 0 at 1e-4 tolerance" in eq
    assert "per-robot delay sums within 3.3e-16 relative" in eq
    assert "case `overload` with L1D vs L1 (23 timeouts and 17 overflows of 137 offered messages); case" in eq
    assert "E = 8, R = 6, T = 50" in eq

    conv = section(page, "## Convergence as tau → 0")
    assert "Discrete mean delay: 0.382 control steps (L1) and 0.638 (QA)." in conv
    assert "| discrete | 0.382 | 2.501 | | 0.638 | 2.725 | | |" in conv
    assert "| 0.05 | 0.411 | 2.576 | 7.5 % | 0.686 | 2.807 | 7.5 % |" in conv
    assert "falls roughly linearly in tau for L1D (fitted log-log slope 1)" in conv
    assert "at most 7.5 % at tau = 0.05 and at most 0.3 % at tau = 0.002" in conv
    assert "biases the mean delay upward in L1D and upward in QAD at every tau of the table." in conv

    curves = section(page, "### Convergence curves")
    assert "E = 64, R = 8, T = 200 and loads p = 0.2, 0.4 and 0.6:" in curves
    assert "![mean delay vs tau, relaxed and discrete](figures/convergence_curves.png)" in curves
    assert (tmp_path / "page" / "figures" / "convergence_curves.png").exists()

    grad = section(page, "## Gradient correctness")
    assert "passes in float64" in grad and "32 of 32 checks, 29 of them with a nonzero gradient" in grad
    assert "E = 2, R = 3, T = 4, K = 4, F = 3" in grad
    fd = section(page, "### Finite differences at scale")
    assert "E = 32, R = 8, T = 60, K = 40" in fd
    assert "better than 1.7e-6 relative for every input (tolerance 1e-4)" in fd
    assert "shrinks roughly quadratically with the step" in fd
    assert "worst 0.017 at step 0.01, 3.9e-6 at step 1e-5" in fd
    assert "Signs are physical" in fd

    cost = section(page, "## Cost")
    assert "| L1D | eager | cpu | 16 | 60 | 1 | 0.4 | 0.5 | n/a | 345 | 24.3× |" in cost
    assert "| L1D | eager | cpu | 1024 | 200 | 1 | 21 | 24.8 | n/a | 3310 | – |" in cost
    assert ("per-slot autograd 1.8 s, eager 0.9 s (2× faster), "
            "compiled 0.12 s (15× faster; the bar is 7×: met)") in cost
    assert "recomputes the rest in the backward): forward 21 s, backward 24.8 s" in cost
    assert "No CUDA device was visible to this run" in cost
    assert "| L1D | compiled | 16 | 0.1 | 0.12 | **not met** |" in cost
    assert "failed: `timed out after 900 s`" in cost
    assert "L2-legacy: not available (`ModuleNotFoundError: no l2_legacy`)" in cost

    sens = section(page, "## Sensitivity against L2-legacy")
    assert "- tx_grad_aoi: -0.79" in sens
    assert "| input | relaxed | l2_fd |" in sens and "| tx | -0.79 | -0.61 |" in sens
    assert "_Provenance (sensitivity): profile `fixture`" in sens
    assert "load average 0.25 at the start and 0.75 at the end, wall time 12.5 s" in sens

    guide = section(page, "## Temperature guidance")
    assert "tau = 0.05 is a reasonable default" in guide and "7.5 % (L1D)" in guide
    assert "the gradcheck stage uses 1e-6 in float64" in guide
    assert "the K = 40 UL slots" in section(page, "## Limits")
    assert check_numbers.check_page(page) == []


def test_absent_artifacts_render_as_pending_with_their_command(tmp_path):
    arts = fixture_artifacts()
    del arts["cost"], arts["sensitivity"]
    page = build_page(tmp_path, arts)
    for heading, name in (("## Cost", "cost"), ("## Sensitivity against L2-legacy", "sensitivity"),
                          ("## Optimization demo", "opt_rates"), ("## Placement", "placement"),
                          ("## Neural proxy", "nn_proxy")):
        text = section(page, heading)
        assert "Pending: no artifact" in text
        assert f"`snakemake --cores 32 {tmp_path / 'results' / name}.json`" in text
    assert "the K UL slots" in section(page, "## Limits")


def test_missing_value_fails_the_render():
    arts = fixture_artifacts()
    del arts["convergence"]["summary"]["L1_discrete_delay"]
    paths = {name: f"{name}.json" for name in render.STAGES}
    with pytest.raises(jinja2.UndefinedError, match="L1_discrete_delay"):
        render.render(arts, paths, paths, "fixture")


@pytest.mark.parametrize("name, mutate, where", [
    ("equivalence", lambda d: d["summary"].pop("tol"), "summary"),
    ("convergence", lambda d: d.update(table="not a list"), "table"),
    ("gradcheck", lambda d: d["provenance"].pop("git_commit"), "provenance"),
    ("sensitivity", lambda d: d["summary"].update(bad=[1, 2]), "summary/bad"),
])
def test_artifact_with_a_wrong_schema_fails_clearly(tmp_path, name, mutate, where):
    arts = copy.deepcopy(fixture_artifacts())
    mutate(arts[name])
    with pytest.raises(render.ArtifactError) as err:
        build_page(tmp_path, arts)
    msg = str(err.value)
    assert f"{name}.json: artifact {name!r} does not match the schema" in msg
    assert f"at {where}" in msg


def test_check_numbers_flags_a_number_without_an_artifact_value(tmp_path):
    page = build_page(tmp_path, fixture_artifacts())
    assert check_numbers.check_page(page) == []
    tampered = page.replace("Discrete mean delay: 0.382", "Discrete mean delay: 0.391")
    problems = check_numbers.check_page(tampered)
    assert len(problems) == 1 and "0.391 not in" in problems[0]
    # A number in a section is checked against that section's artifacts only.
    moved = page.replace("## Cost\n", "## Cost\n\nDiscrete mean delay 0.638.\n")
    assert any("0.638 not in" in p for p in check_numbers.check_page(moved))


@pytest.mark.parametrize("token, value, ok", [
    ("0.382", 0.38249, True), ("0.382", 0.3826, False), ("1e-4", 1.4e-4, True), ("3.9e-6", 3.96e-6, False),
    ("16", 16, True), ("-0.79", -0.7911, True),
])
def test_number_matching_respects_printed_precision(token, value, ok):
    assert check_numbers.matches(token, [value]) is ok


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_each_profile_is_complete_and_valid(profile):
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    cfg = yaml.safe_load((REPO / PROFILES[profile]).read_text())
    jsonschema.Draft202012Validator(schema).validate(cfg)
    assert cfg["profile"] == profile


# ------------------------------------------------------------------------------ snakemake
STUB = '''import shutil
from pathlib import Path
for path in snakemake.output:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if path.endswith(".json"):
        shutil.copyfile(Path("fixtures") / Path(path).name, path)
    else:
        Path(path).write_bytes(b"stub")
Path(snakemake.log[0]).write_text("stub\\n")
'''


def workflow_copy(dest: Path, *, stubs: bool) -> Path:
    """A copy of the workflow in ``dest``; with ``stubs`` the stage scripts copy fixtures."""
    for rel in ("Snakefile", "environment.yml", "workflow/rules", "workflow/schemas", "config", "reports",
                "isaac_net"):
        src = REPO / rel
        if not src.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.md", "figures"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / rel)
    (dest / "benchmarks/diff").mkdir(parents=True)
    for f in (REPO / "benchmarks/diff").glob("*.py"):
        (dest / "benchmarks/diff" / f.name).write_text(STUB if stubs else f.read_text())
    if stubs:
        arts = fixture_artifacts() | {name: study_artifact(name) for name in STUDIES}
        (dest / "fixtures").mkdir()
        for name, data in arts.items():
            (dest / "fixtures" / f"{name}.json").write_text(json.dumps(data))
    return dest


def snakemake(cwd: Path, *args: str) -> str:
    proc = subprocess.run([str(SNAKEMAKE), *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def job_counts(out: str) -> dict[str, int]:
    """The first "Job stats" table of a snakemake run or dry run."""
    block = out.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    rows = [ln.split() for ln in block.splitlines()[3:]]
    return {r[0]: int(r[1]) for r in rows if len(r) == 2 and r[0] != "total"}


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_dry_run_lists_every_stage_and_the_report(tmp_path, profile):
    wf = workflow_copy(tmp_path, stubs=True)
    args = ["-n", "--forceall", "--cores", "2"]
    if profile != "full":
        args += ["--configfile", PROFILES[profile]]
    out = snakemake(wf, *args)
    jobs = job_counts(out)
    assert STAGE_JOBS | {"report", "all"} <= set(jobs)
    assert all(n == 1 for n in jobs.values())
    page = "reports/checks_and_measurements.md" if profile == "full" else \
        f"benchmarks/diff/results/{profile}/checks_and_measurements.md"
    assert page in out
    assert f"benchmarks/diff/results/{profile}/equivalence.json" in out


@pytest.mark.slow
def test_lint_is_clean(tmp_path):
    wf = workflow_copy(tmp_path, stubs=False)
    for args in ([], ["--configfile", "config/ci.yaml"]):
        assert "Congratulations" in snakemake(wf, "--lint", *args)


@pytest.mark.slow
def test_a_changed_setting_reruns_only_its_stage_and_the_report(tmp_path):
    wf = workflow_copy(tmp_path, stubs=True)
    ci = ["--configfile", "config/ci.yaml"]
    out = snakemake(wf, "report", "--cores", "2", *ci)
    assert set(job_counts(out)) == STAGE_JOBS | {"report"}
    page = wf / "benchmarks/diff/results/ci/checks_and_measurements.md"
    assert "Discrete mean delay: 0.382" in page.read_text()
    assert "Nothing to be done" in snakemake(wf, "-n", "report", "--cores", "2", *ci)

    cfg_path = wf / "config/ci.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["gradcheck"]["fd"]["tol"] = 2e-4  # a setting of the fd_check rule only
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = snakemake(wf, "-n", "report", "--cores", "2", *ci)
    assert set(job_counts(out)) == {"fd_check", "report"}
    assert "Params have changed since last execution" in out

    cfg["equivalence"]["cases"]["overload"]["p"] = 0.95
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = snakemake(wf, "-n", "report", "--cores", "2", *ci)
    assert set(job_counts(out)) == {"equivalence", "fd_check", "report"}


def test_cost_stage_adds_the_cuda_graph_rows_on_a_gpu_only():
    """The cost stage's jobs: the captured discrete step (L1, QA) is measured on CUDA only."""
    sys.path.insert(0, str(REPO / "benchmarks" / "diff"))
    import cost

    params = yaml.safe_load((REPO / PROFILES["full"]).read_text())["cost"]
    cpu, gpu = cost._jobs(params, "cpu"), cost._jobs(params, "cuda")
    assert not any(j.get("backend") == "cuda_graph" for j in cpu)
    graphed = [j for j in gpu if j.get("backend") == "cuda_graph"]
    assert sorted((j["name"], j["E"]) for j in graphed) == sorted(
        (lv, E) for lv in ("L1", "QA") for E in params["E"])
    assert {cost._variant(j) for j in graphed} == {"discrete, cuda graph"}
    assert {cost._variant(j) for j in cpu} == {"eager", "compiled", "per-slot autograd", "per-op autograd",
                                               "discrete"}
    assert sorted((j["name"], j["E"]) for j in cpu if j.get("slots") == "autograd") == sorted(
        (m, E) for m in ("L1", "QA") for E in params["E"])
