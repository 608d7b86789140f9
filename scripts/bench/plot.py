"""The benchmark's figures as one SVG (no plotting library needed): four panels of bars, targets as dashed lines."""

from __future__ import annotations

from html import escape

PANEL_WIDTH, PANEL_HEIGHT, MARGIN = 280, 270, 40
BAR_COLOURS = ("#4c78a8", "#9ecae9", "#f58518", "#e45756", "#54a24b", "#b279a2")


def _panel(x0: int, title: str, unit: str, bars: list[tuple[str, float]], target: float | None = None) -> list[str]:
    """SVG elements of one panel at x offset x0: labelled bars (value in `unit`) and an optional target line."""
    top, bottom = 40, PANEL_HEIGHT - 50
    scale_max = max([value for _label, value in bars] + [target or 0]) * 1.15 or 1.0
    width = (PANEL_WIDTH - 2 * 10) / max(1, len(bars))
    parts = ['<text x="%d" y="20" font-size="13" font-weight="bold">%s</text>' % (x0 + 10, escape(title))]
    parts.append(
        '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>' % (x0 + 10, bottom, x0 + PANEL_WIDTH - 10, bottom)
    )
    for number, (label, value) in enumerate(bars):
        height = (bottom - top) * value / scale_max
        x = x0 + 10 + number * width
        parts.append(
            '<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>'
            % (x + 4, bottom - height, width - 8, height, BAR_COLOURS[number % len(BAR_COLOURS)])
        )
        parts.append(
            '<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle">%s</text>'
            % (x + width / 2, bottom - height - 4, escape(_format(value, unit)))
        )
        parts.append(
            '<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>'
            % (x + width / 2, bottom + 14, escape(label))
        )
    if target is not None:
        y = bottom - (bottom - top) * target / scale_max
        parts.append(
            '<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d62728" stroke-dasharray="5,4"/>'
            % (x0 + 10, y, x0 + PANEL_WIDTH - 10, y)
        )
        parts.append(
            '<text x="%d" y="%d" font-size="10" fill="#d62728">dashed: target %s</text>'
            % (x0 + 10, bottom + 32, escape(_format(target, unit)))
        )
    return parts


def _format(value: float, unit: str) -> str:
    return "%.0f %s" % (value, unit) if unit == "ms" else "%.2f %s" % (value, unit)


def svg(results: dict) -> str:
    """The SVG document for run.py's `results` (sections that did not run are left out)."""
    panels = []
    scan = results.get("scan", {}).get("mixed")  # the node of every holder kind (run.py SCAN_NODES)
    if scan:
        wall = scan["median_wall_s"]
        panels.append(
            (
                "Scan, %d procs, %dk fds" % (scan["processes"], scan["fds"] // 1000),
                "ms",
                [
                    ("scan", wall["scan"] * 1000),
                    ("serial", wall["scan_serial"] * 1000),
                    ("fuser -v", wall["fuser"] * 1000),
                    ("lsof", wall["lsof"] * 1000),
                ],
                wall["fuser"] * 500,
            )
        )
    release = results.get("release")
    if release:
        panels.append(
            (
                "gpu_wait: return after release",
                "ms",
                [("%s s" % latency, data["median_delay_s"] * 1000) for latency, data in release.items()],
                100.0,
            )
        )
    node = results.get("node")
    if node:
        panels.append(
            (
                "One node, TP=8 tree",
                "s",
                [("ping play", node["median_noop_s"]), ("reset", node["median_reset_s"])],
                node["median_noop_s"] + 1.0 + node["release_latency_s"],
            )
        )
    fleet = results.get("fleet")
    if fleet:
        labels = (("ping", "ping"), ("check", "check"), ("reset", "reset"), ("reset_orphaned", "orphaned"))
        for figure, title in (("controller_cpu_per_host_s", "controller"), ("node_cpu_per_host_s", "node")):
            panels.append(
                (
                    "Fleet of %d: %s CPU per host" % (fleet["nodes"], title),
                    "ms",
                    [(label, fleet["median"][kind][figure] * 1000) for kind, label in labels],
                    None,
                )
            )
    width = PANEL_WIDTH * max(1, len(panels)) + MARGIN
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">'
        % (width, PANEL_HEIGHT),
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for number, (title, unit, bars, target) in enumerate(panels):
        parts += _panel(MARGIN // 2 + number * PANEL_WIDTH, title, unit, bars, target)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
