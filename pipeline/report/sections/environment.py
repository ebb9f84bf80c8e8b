"""The report's environment: Python, machine architecture and package versions from the report
stage's sidecar, and the registration record."""

from __future__ import annotations

from pipeline.render.document import Document, Heading, Table, fmt
from pipeline.report.context import ReportContext
from pipeline.report.sections.common import not_available


def render(doc: Document, ctx: ReportContext) -> None:
    env, registered = ctx.env, ctx.registered
    doc.add(Heading("Environment"))
    env = env if isinstance(env, dict) else {}
    source = env.get("environment") or {}
    # the architecture, not the platform string: a kernel update must not change the report
    rows = [["python", fmt(source.get("python"))], ["machine", fmt(source.get("machine"))]]
    rows += [[f"package {k}", fmt(v)] for k, v in sorted((source.get("packages") or {}).items())]
    doc.add(Table(["fact", "value"], rows))
    doc.add(Heading("Registration record", 3))
    ident = registered.get("identity") if isinstance(registered, dict) else None
    if isinstance(ident, dict):
        git = env.get("git") or {}
        rows = [["identity hash", fmt(registered.get("identity_hash"))],
                ["split hash", fmt(ident.get("split_hash"))],
                ["test pieces registered",
                 fmt(len((ident.get("pieces") or {}).get("test") or []))],
                ["forced over earlier looks", fmt(registered.get("forced"))],
                ["looks before registering", fmt(len(registered.get("looks_before") or []))],
                ["registration commit", fmt(git.get("registration_commit"))],
                ["results commit", fmt(git.get("results_commit"))],
                ["registration precedes results", fmt(git.get("registration_precedes_results"))]]
        rows += [[f"frozen package {k}", fmt(v)]
                 for k, v in sorted((ident.get("packages") or {}).items())]
        doc.add(Table(["field", "value"], rows))
    else:
        not_available(doc, "reports/preregistration.json (schema 3)")
