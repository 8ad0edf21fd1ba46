"""The critical path of the job graph (reports/render.py ``critical_path``): the longest chain of jobs
by summed wall time, followed through ``provenance.inputs`` of the artifacts, and its paragraph in the
page's "This run" section."""

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "reports"))

import check_numbers  # noqa: E402
import render  # noqa: E402


def job(root: Path, name: str, stage: str, wall_s: float, reads: tuple[str, ...] = (),
        writes: tuple[str, ...] = (), **prov) -> Path:
    """Write the artifact ``root/name`` of a job: ``reads`` and ``writes`` relative to ``root``."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    inputs = {"params_sha256": "0" * 64, "files": {f: "1" * 64 for f in ("src/lib.py", *reads)},
              "outputs": {f: "2" * 64 for f in writes}, "self_sha256": "3" * 64}
    path.write_text(json.dumps({"summary": {}, "provenance": {"stage": stage, "wall_s": wall_s,
                                                              "inputs": inputs, **prov}}))
    return path


def chain(result: dict) -> list[tuple[str, str, float]]:
    return [(j["stage"], j["artifact"], j["wall_s"]) for j in result["jobs"]]


def test_a_diamond_takes_its_longer_branch(tmp_path):
    job(tmp_path, "a.json", "prep", 10.0)
    job(tmp_path, "b.json", "fast", 5.0, reads=("a.json",), torch_threads=2)
    job(tmp_path, "c.json", "slow", 20.0, reads=("a.json",))
    root = job(tmp_path, "d.json", "merge", 1.5, reads=("b.json", "c.json"))
    result = render.critical_path([root], base=tmp_path)
    assert chain(result) == [("prep", "a.json", 10.0), ("slow", "c.json", 20.0), ("merge", "d.json", 1.5)]
    assert result["seconds"] == 31.5
    assert result["minutes"] == pytest.approx(31.5 / 60)
    assert result["n_jobs_total"] == 4
    assert result["jobs"][0]["path"] == "a.json"
    # every job's work, off the path too: wall time times its threads (1 where not recorded)
    assert result["work_s"] == 10.0 + 2 * 5.0 + 20.0 + 1.5
    assert {(w["stage"], w["threads"]) for w in result["work"]} == {("prep", 1), ("fast", 2), ("slow", 1),
                                                                     ("merge", 1)}
    assert render.traced_critical_path(result, base=tmp_path)["work_s"].value == 41.5
    assert result["span_s"] is None  # no job recorded its start
    assert "span_s" not in render.traced_critical_path(result, base=tmp_path)


def test_the_span_runs_from_the_first_job_to_start_to_the_last_to_end_parts_included(tmp_path):
    # a part starts before every stage and the stage that ends last is not the one that started last
    job(tmp_path, "parts/a.json", "part", 10.0, started_unix=100.0)
    job(tmp_path, "b.json", "stage_b", 50.0, reads=("parts/a.json",), started_unix=112.0)
    root = job(tmp_path, "c.json", "stage_c", 5.0, reads=("b.json",), started_unix=140.0)
    result = render.critical_path([root], base=tmp_path)
    assert result["span_s"] == 162.0 - 100.0
    assert render.traced_critical_path(result, base=tmp_path)["span_s"].value == 62.0


def test_a_non_json_output_leads_to_the_job_that_wrote_it(tmp_path):
    job(tmp_path, "results/parts/model.json", "train", 100.0,
        writes=("results/parts/model.pt", "results/parts/model.csv"))
    job(tmp_path, "results/use.json", "use", 50.0, reads=("results/parts/model.pt",))
    job(tmp_path, "results/unrelated.json", "other", 500.0)  # not upstream: not in the graph
    page_a = job(tmp_path, "results/page_a.json", "report_a", 2.0, reads=("results/use.json",))
    page_b = job(tmp_path, "results/page_b.json", "report_b", 3.0)
    result = render.critical_path([page_a, page_b], base=tmp_path)
    assert chain(result) == [("train", "parts/model.json", 100.0), ("use", "use.json", 50.0),
                             ("report_a", "page_a.json", 2.0)]
    assert result["jobs"][-1]["path"] == str(Path("results/page_a.json"))
    assert (result["seconds"], result["n_jobs_total"]) == (152.0, 4)


def test_inputs_that_are_no_job_are_left_out(tmp_path):
    (tmp_path / "table.csv").write_text("a,b\n")  # no artifact lists it among its outputs
    (tmp_path / "plain.json").write_text(json.dumps({"rows": [1, 2]}))  # no provenance
    root = job(tmp_path, "x.json", "x", 4.0, reads=("table.csv", "plain.json", "missing.json"))
    result = render.critical_path([str(root)], base=tmp_path)
    assert chain(result) == [("x", "x.json", 4.0)]
    assert result["n_jobs_total"] == 1


def test_a_cycle_fails_naming_it(tmp_path):
    job(tmp_path, "x.json", "x", 1.0, reads=("y.json",))
    job(tmp_path, "y.json", "y", 1.0, reads=("z.csv",))
    job(tmp_path, "w.json", "w", 1.0, writes=("z.csv",), reads=("x.json",))
    with pytest.raises(ValueError, match=r"roots: the jobs' inputs form a cycle .*x\.json -> .*y\.json"):
        render.critical_path([tmp_path / "x.json"], base=tmp_path)


def test_bad_roots_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="roots: expected at least one artifact"):
        render.critical_path([], base=tmp_path)
    (tmp_path / "no_wall.json").write_text(json.dumps({"provenance": {"stage": "s"}}))
    with pytest.raises(ValueError, match=r"roots: .*no_wall\.json is not a job's artifact"):
        render.critical_path([tmp_path / "no_wall.json"], base=tmp_path)


def work(*jobs) -> tuple[list[dict], dict]:
    """``replay_span_s``'s inputs from ``(path, stage, wall_s, threads, started_unix, upstream paths)``."""
    keys = ("path", "stage", "wall_s", "threads", "started_unix")
    return [dict(zip(keys, j[:5], strict=True)) for j in jobs], {j[0]: list(j[5]) for j in jobs}


def test_the_replay_waits_for_inputs_and_cores_in_the_runs_order():
    jobs, ups = work(("a", "fit", 10.0, 1, 0.0, ()), ("b", "fit", 10.0, 1, 1.0, ()),
                     ("c", "cost_threads", 5.0, 2, 30.0, ("a", "b")), ("d", "study_x", 40.0, 1, 2.0, ()))
    # 2 cores: a and b side by side (0-10), d after a (10-50), c needs both cores: after d (50-55)
    assert render.replay_span_s(jobs, ups, 2) == 55.0
    assert render.replay_span_s(jobs, ups, 1) == 65.0  # one core: one after another; c takes the one core
    assert render.replay_span_s(jobs, ups, 8) == 40.0  # enough cores: the longest chain, d
    # without the study: a, b, then c; its start-up added to every job
    assert render.replay_span_s(jobs, ups, 2, without=["study"]) == 15.0
    assert render.replay_span_s(jobs, ups, 2, without=["study"], start_s=1.0) == 17.0
    # a stage holds its parts, not another stage that shares the start of its name
    jobs2, ups2 = work(("a", "study", 10.0, 1, 0.0, ()), ("b", "study_part", 10.0, 1, 1.0, ()),
                       ("c", "studying", 7.0, 1, 2.0, ()))
    assert render.replay_span_s(jobs2, ups2, 1, without=["study"]) == 7.0
    # the start-up that makes the replay the measured span
    assert render.replay_start_s(jobs, ups, 2, 58.0) == pytest.approx(1.0)
    assert render.replay_start_s(jobs, ups, 2, 1e6) is None
    jobs[0]["started_unix"] = None
    assert render.replay_span_s(jobs, ups, 2) is None  # no order to replay
    with pytest.raises(ValueError, match="cores: expected a positive int"):
        render.replay_span_s(jobs, ups, 0)


def render_this_run(tmp_path: Path, target_s: float | None, run_target_s: float | None = None,
                    without: dict | None = None) -> str:
    """The "This run" section over one cost artifact read after a preparing job; checks its numbers."""
    config = {} if target_s is None else {"critical_path_target_s": target_s}
    config |= {} if run_target_s is None else {"run_target_s": run_target_s}
    config |= {} if without is None else {"run_target_without": without}
    # with a replay's target, prep's start is recorded too (a span over both jobs, an order to replay)
    start = {} if without is None else {"started_unix": 900.0}
    job(tmp_path, "res/prep.json", "prep", 90.0, torch_threads=2, **start)
    cost = job(tmp_path, "res/cost.json", "cost", 30.0, reads=("res/prep.json",), config=config,
               started_unix=1000.0, git_commit="0123456789abcdef", cpu_count=4, torch_threads=1)
    shutil.copytree(REPO / "reports" / "sections", tmp_path / "sections")
    (tmp_path / "page.md.j2").write_text('{% include "sections/this_run.md.j2" %}')
    crit = render.traced_critical_path(render.critical_path([cost], base=tmp_path, cores=4,
                                                            without=(without or {}).get("stages", ())),
                                       base=tmp_path)
    arts = {"cost": json.loads(cost.read_text())}
    text, entries = render.render_traced(arts, {"cost": str(cost)}, {}, "fixture",
                                         template=tmp_path / "page.md.j2", critical=crit)
    assert check_numbers.check_page(text, render.trace_document(text, entries, "fixture")) == []
    return text


def test_the_page_states_the_critical_path_and_its_target(tmp_path):
    text = render_this_run(tmp_path / "over", 60)
    assert "The critical path of the Snakemake job graph is 2 min" in text
    assert "among the 2 jobs" in text
    assert "`prep` (`prep.json`, 90 s) → `cost` (`cost.json`, 30 s)." in text
    assert ("at most 1 min: **not met**, 1 min over; its longest job, `prep` (`prep.json`), alone takes "
            "1.5 min.") in text
    assert "at most 10 min: met." in render_this_run(tmp_path / "met", 600)
    text = render_this_run(tmp_path / "none", None)
    assert "critical path of the Snakemake job graph is 2 min" in text and "target" not in text


def test_the_page_counts_every_jobs_work_against_the_profile_target(tmp_path):
    text = render_this_run(tmp_path, 600, run_target_s=60)
    # prep (not a stage of the page) 90 s on 2 threads, cost 30 s on 1: 210 core-s
    assert ("add up to 3.5 core-minutes (all 2 jobs, the fits and the other parts included): at least "
            "0.875 min on 4 cores, whatever the schedule. The target for the `fixture` profile is at most "
            "1 min: met.") in text


def test_the_page_estimates_the_span_without_some_stages_by_a_replay(tmp_path):
    # the graph of the cost artifact: prep (900-990, 2 threads) then cost (1000-1030); span 130 s.
    # On 4 cores the replay takes 120 s; 5 s of start-up per job makes it the span.
    text = render_this_run(tmp_path / "w", 600, run_target_s=600, without={"stages": ["prep"], "s": 60})
    assert "takes 2 min against the 2.17 min measured: with 5 s added to every job" in text
    assert ("Without the jobs of `prep` (the target below was set before that study was part of the "
            "profile), the same replay, start-up included, takes 0.583 min") in text
    assert "The target for the profile without them is at most 1 min: met by that estimate." in text
    text = render_this_run(tmp_path / "o", 600, run_target_s=600, without={"stages": ["prep"], "s": 30})
    assert "at most 0.5 min: **not met** by that estimate." in text
    assert "Without the jobs" not in render_this_run(tmp_path / "n", 600, run_target_s=600)


def test_the_committed_full_artifacts_have_a_critical_path():
    results = REPO / "benchmarks" / "diff" / "results" / "full"
    roots = [results / f"{name}.json" for name in render.STAGES if (results / f"{name}.json").exists()]
    if not roots:
        pytest.skip("no committed artifacts of the full profile")
    result = render.critical_path(roots)
    assert result["minutes"] > 0 and result["jobs"]
    assert result["jobs"][-1]["path"] in {str(r.relative_to(REPO)) for r in roots}
    assert result["seconds"] == pytest.approx(sum(j["wall_s"] for j in result["jobs"]))
    assert result["n_jobs_total"] >= len(roots)
    traced = render.traced_critical_path(result)
    assert traced["minutes"].value == pytest.approx(result["minutes"])


def test_the_slurm_comparison_leaves_the_run_section_out_and_compares_the_rest(tmp_path):
    """A SLURM run and a local one differ in every timing of "This run" (the span, the replay, the
    yardstick); tests/slurm/compare_results.py compares the pages' other numbers token by token."""
    sys.path.insert(0, str(REPO / "tests" / "slurm"))
    import compare_results

    def page(name: str, run_min: float, checked: float) -> Path:
        path = tmp_path / name
        path.write_text(f"## Sensitivity\n\nmedian ratio {checked}\n\n## This run\n\n"
                        f"A replay takes {run_min} min against the {run_min + 2} min measured.\n\n"
                        "## Limits\n\n- 3 things.\n")
        return path

    local, _ = compare_results.page_tokens(page("local.md", 17.9, 0.62))
    assert local == ["0.62", "3"]
    assert compare_results.page_tokens(page("slurm.md", 5.86, 0.62))[0] == local
    assert compare_results.page_tokens(page("other.md", 17.9, 0.65))[0] != local
