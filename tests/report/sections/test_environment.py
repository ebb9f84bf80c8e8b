"""The report's environment section (pipeline.report.sections.environment): Python, the
machine's architecture and package versions from the sidecar, and the registration record."""

from __future__ import annotations

from pipeline.core import artifacts
from pipeline.decision.preregistration import build, identity
from pipeline.render.document import NA
from pipeline.report.sections import environment
from tests.report.test_context import make_context, rendered
from tests.stages.test_report import make_inputs, outputs, report, write_params

SIDECAR = {"environment": {"python": "3.11.7", "machine": "aarch64",
                           "platform": "Linux-6.1-aarch64-with-glibc2.36", "cpu_count": 8,
                           "packages": {"torch": "2.3.0", "numpy": "2.0.0"}},
           "git": {"registration_commit": "c0ffee" * 6 + "0000", "results_commit": None,
                   "registration_precedes_results": True}}


def test_without_a_sidecar_or_registration_the_facts_are_not_available(tmp_path):
    md = rendered(environment.render, make_context(tmp_path))
    assert f"| python | {NA} |" in md and f"| machine | {NA} |" in md
    assert "### Registration record" in md
    assert f"reports/preregistration.json (schema 3): {NA}." in md
    old_schema = make_context(tmp_path, registered={"schema": 1, "criteria": []})
    assert f"reports/preregistration.json (schema 3): {NA}." in rendered(environment.render,
                                                                          old_schema)


def test_the_architecture_python_and_sorted_packages_not_the_platform(tmp_path):
    md = rendered(environment.render, make_context(tmp_path, env=SIDECAR))
    assert "| python | 3.11.7 |" in md and "| machine | aarch64 |" in md
    assert md.index("| package numpy | 2.0.0 |") < md.index("| package torch | 2.3.0 |")
    assert "Linux" not in md and "cpu_count" not in md and "| 8 |" not in md


def test_the_registration_record_and_where_git_shows_it(tmp_path):
    rec = build(identity({}, "h" * 64, {"torch": "2.3.0"},
                         {"test": ["t1", "t2", "t3"], "val": ["v"]}))
    md = rendered(environment.render, make_context(tmp_path, env=SIDECAR, registered=rec))
    assert f"| identity hash | {rec['identity_hash']} |" in md
    assert f"| split hash | {'h' * 64} |" in md
    assert "| test pieces registered | 3 |" in md and "| forced over earlier looks | false |" in md
    assert "| looks before registering | 0 |" in md
    assert f"| registration commit | {'c0ffee' * 6}0000 |" in md
    assert f"| results commit | {NA} |" in md and "| registration precedes results | true |" in md
    assert "| frozen package torch | 2.3.0 |" in md and f"| frozen package numpy | {NA} |" in md


def test_the_rendering_machine_s_kernel_and_cores_stay_out_of_the_report(tmp_path):
    """Re-rendering on another kernel or core count keeps the report's bytes; the machine's
    architecture, Python and package versions are shown."""
    p = make_inputs(tmp_path)
    params = write_params(tmp_path)
    runs = []
    for kernel, cores in (("Linux-6.1-x86_64-with-glibc2.36", 2), ("Linux-6.18-x86_64", 64)):
        env = artifacts.read_json(p.env)
        env["environment"].update(python="3.11.7", platform=kernel, machine="x86_64",
                                  cpu_count=cores)
        artifacts.write_json(p.env, env)
        report(tmp_path, params, p, look=not runs)
        runs.append(outputs(p))
    assert runs[0] == runs[1]
    md = p.md_out.read_text()
    assert "| machine | x86_64 |" in md and "| python | 3.11.7 |" in md and "Linux" not in md
