"""Writing benchmark results: ``<out>/<name>.json`` plus a markdown table beside it.

The JSON layout is the one every gpext benchmark uses::

    {"benchmark": str, "command": str, "rows": [{"dataset": str, "method": str, <metric>: float}]}
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "WARNING_FIELDS",
    "aggregate_rows",
    "aggregate_warnings",
    "format_markdown_table",
    "invocation",
    "write_results",
]


def invocation() -> str:
    """The command line of the running process, for the ``command`` field."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(("__main__.py", "gpext")):
        argv[0] = "gpext"
    elif argv and argv[0].endswith(".py"):
        argv = ["python", argv[0], *argv[1:]]
    return " ".join(shlex.quote(a) for a in argv)


def _fmt(value: object, max_width: int | None = None) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4f}"
    text = " ".join(str(value).split())  # one line: newlines would end the table row
    if max_width is not None and len(text) > max_width:
        text = text[: max(max_width - 3, 1)] + "..."
    return text.replace("|", "\\|")


def format_markdown_table(
    rows: Sequence[dict], columns: Sequence[str] | None = None, *, max_width: int | None = None
) -> str:
    """Render rows (dicts) as a GitHub markdown table; columns default to the union of keys.

    Text cells are put on one line with ``|`` escaped; ``max_width`` shortens longer text
    cells (e.g. warning messages) to that many characters, ending in ``...``.
    """
    if not rows:
        return "(no rows)\n"
    if columns is None:
        columns = []
        for row in rows:
            for key in row:
                if key not in columns:
                    columns.append(key)
    lines = [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, ""), max_width) for c in columns) + " |")
    return "\n".join(lines) + "\n"


#: Per-fit warning fields (see :func:`gpext_bench.runner.summarize_warnings`); aggregated by
#: :func:`aggregate_rows` as counts and the first text, not averaged.
WARNING_FIELDS = ("warnings", "warning", "warning_classes")


def aggregate_warnings(members: Sequence[dict]) -> dict:
    """The warning fields of a group of per-fit rows (failed fits included).

    Returns:
        ``{}`` when no row has a ``warnings`` field; else ``warnings`` (total number of gpext
        warnings), ``warned_fits`` (fits with at least one), ``warning`` (the first fit's
        ``warning`` text that is not empty, or ``""``) and ``warning_classes`` (sorted union).
    """
    if not any("warnings" in r for r in members):
        return {}
    counts = [int(r.get("warnings") or 0) for r in members]
    texts = [r.get("warning") for r in members if r.get("warning")]
    classes = sorted(
        {c for r in members for c in str(r.get("warning_classes") or "").split(",") if c}
    )
    return {
        "warnings": sum(counts),
        "warned_fits": sum(c > 0 for c in counts),
        "warning": texts[0] if texts else "",
        "warning_classes": ",".join(classes),
    }


def aggregate_rows(rows: Sequence[dict], keys: Sequence[str] = ("dataset", "method")) -> list[dict]:
    """Average numeric fields over rows sharing ``keys``; adds ``<metric>_se`` standard errors.

    Rows that differ only in e.g. ``split`` or ``seed`` are merged; ``n`` counts them.  A row
    with a ``failure`` field (a fit that raised) adds nothing to the averages: such rows are
    counted in ``failed`` and ``n`` counts the others.  Rows carrying the per-fit warning
    fields of ``gpext bench`` (``warnings``, ``warning``, ``warning_classes``) are summarised
    by :func:`aggregate_warnings` over all rows of the group, failed ones included:
    ``warnings`` is the total, ``warned_fits`` the number of warned fits, ``warning`` the
    first warning text.
    """
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    out = []
    skip = {"split", "seed", *WARNING_FIELDS}
    for key, members in groups.items():
        agg = dict(zip(keys, key))
        ok = [r for r in members if not r.get("failure")]
        metric_names: list[str] = []
        for r in ok:
            for m, v in r.items():
                numeric = isinstance(v, (int, float))
                if m not in keys and m not in skip and numeric and m not in metric_names:
                    metric_names.append(m)
        for metric in metric_names:
            vals = [float(r[metric]) for r in ok if metric in r]
            n = len(vals)
            mean = sum(vals) / n
            agg[metric] = mean
            if n > 1 and metric != "n":
                var = sum((v - mean) ** 2 for v in vals) / (n - 1)
                agg[f"{metric}_se"] = math.sqrt(var / n)
        agg["n"] = len(ok)
        if len(ok) < len(members):
            agg["failed"] = len(members) - len(ok)
        agg.update(aggregate_warnings(members))
        out.append(agg)
    return out


def write_results(
    name: str,
    rows: Sequence[dict],
    out_dir: str | Path,
    *,
    command: str | None = None,
    extra: dict | None = None,
    title: str | None = None,
    markdown_skip: Sequence[str] = (),
    preamble: str | None = None,
    columns: Sequence[str] | None = None,
    max_width: int | None = None,
) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md``.

    Args:
        name: Benchmark name (file stem and the ``benchmark`` field).
        rows: Result rows; each has at least ``dataset`` and ``method``.
        out_dir: Output folder (created if missing).
        command: Command that produced the rows (default: this process's command line).
        extra: Additional top-level JSON fields (e.g. goals met, machine info).
        title: Heading of the markdown file.
        markdown_skip: Keys of ``extra`` kept out of the markdown file (e.g. long per-seed
            dumps); they are still written to the JSON, and the markdown says so.
        preamble: Markdown placed between the command line and the rows table (e.g.
            summary tables).
        columns: Columns of the markdown rows table (default: the union of the rows' keys).
        max_width: Longest text cell of the markdown rows table (longer ones are shortened;
            the JSON keeps them whole).

    Returns:
        The paths of the JSON and markdown files.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = command or invocation()
    payload = {"benchmark": name, "command": command, "rows": list(rows)}
    if extra:
        payload.update(extra)
    json_path = out / f"{name}.json"
    json_path.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    md = [f"# {title or name}", "", f"Command: `{command}`", ""]
    if preamble:
        md += [preamble.rstrip("\n"), ""]
    md.append(format_markdown_table(rows, columns, max_width=max_width))
    if extra:
        for k, v in extra.items():
            if k in markdown_skip:
                md.append(f"**{k}**: in `{name}.json`\n")
            else:
                md.append(f"**{k}**: {json.dumps(v, default=float)}\n")
    md_path = out / f"{name}.md"
    md_path.write_text("\n".join(md))
    return json_path, md_path
