"""What gpu-check's report says: each notebook's status, the issue's targets met or not, and the summary it prints.

Everything here reads the report (`gpu-check.json`'s dictionary) and measures nothing; the tests check it on
reports of their own making.
"""

from __future__ import annotations

import importlib.util
import re

TARGETS = [  # (key, what, comparison, threshold, unit): issue 48's targets for one H100 or H200
    ("plan_ms_1", "one plan at batch 1 (halfcheetah preset, float32, beam_plan's default decoder)", "<=", 5.0, "ms"),
    ("plan_ms_25", "one plan at batch 25 (the same)", "<=", 12.0, "ms"),
    ("plan_ms_100", "one plan at batch 100 (the same)", "<=", 35.0, "ms"),
    ("rollouts_s", "25 x 1,000-step HalfCheetah rollouts, vectorized, end to end", "<=", 20.0, "s"),
    ("notebooks_not_passed", "notebooks not passed in full mode (08 aside: Ray is not carried)", "<=", 0, ""),
]


def notebook_status(result: dict, left_out: dict) -> str:
    """A notebook's status from what its process reported: passed, failed, timed out, or not run because it
    needs a package the wheels leave out on purpose (`left_out`, from their manifest.json): one that is not
    installed here, and that its error names -- as a missing module, or as "X ... not installed" (ttlib's own
    message when Ray is missing)."""
    outcome = result.pop("outcome", None)  # the notebook's; "status" is its process's
    if outcome == "running":  # stopped at its limit while this cell ran
        return f"{result['status']} in cell {result.get('cell')} ({result.get('cell_id')})"
    for package, why in left_out.items():
        named = result.get("missing_module") == package or re.search(
            rf"\b{re.escape(package)}\b[^.]*\bnot installed", result.get("evalue", ""), re.IGNORECASE)
        if outcome == "failed" and named and importlib.util.find_spec(package) is None:
            return f"not run: needs {package} ({why})"
    return outcome or result["status"]


def targets(report: dict) -> list[dict]:
    """The issue's targets, each with what was measured, at which sizes, and met or not (None where the sizes
    are not the target's, as in a smoke run, or nothing was measured)."""
    parts = report["parts"]
    rollouts, notebooks = parts.get("rollouts", {}), parts.get("notebooks", {})
    runs = {r["batch"]: r for r in parts.get("planning", {}).get("runs", [])}
    measured = {f"plan_ms_{b}": (runs[b]["ms_per_plan_cached"], {"preset": runs[b]["preset"], "batch": b,
                                                                 "decoder": runs[b]["default_decoder"]},
                                 runs[b]["preset"] == "halfcheetah") if b in runs else (None, None, False)
                for b in (1, 25, 100)}
    measured["rollouts_s"] = (rollouts.get("vectorized_s"), {k: rollouts.get(k) for k in (
        "env_id", "episodes", "max_steps", "planned_steps", "steps_per_s", "projected_s")},
        rollouts.get("preset") == "halfcheetah" and rollouts.get("episodes") == 25
        and rollouts.get("max_steps") == 1000)
    results = notebooks.get("results", {})
    not_passed = [n for n, r in results.items() if r["status"] != "passed" and not r["status"].startswith("not run")]
    measured["notebooks_not_passed"] = (len(not_passed) if results else None, {"mode": notebooks.get("mode"),
                                                                               "notebooks": not_passed},
                                        notebooks.get("mode") == "full" and len(results) > 1)
    rows = []
    for key, what, comparison, threshold, unit in TARGETS:
        value, at, applies = measured[key]
        met = None
        if applies and value is not None:
            met = value <= threshold if comparison == "<=" else value >= threshold
        rows.append({"target": what, "key": key, "threshold": f"{comparison} {threshold:g} {unit}".strip(),
                     "unit": unit, "measured": value, "at": at, "applies": bool(applies), "met": met})
    return rows


def summary(report: dict) -> list[str]:
    """The report in a few lines: each part, the figures that matter, the targets."""
    env = report.get("environment", {})
    lines = [f"gpu-check{' --smoke' if report['smoke'] else ''}: {env.get('device', '?')} ({env.get('device_name')}),"
             f" torch {env.get('torch')}, Python {env.get('python')}; {report.get('seconds')} s of a "
             f"{report['budget_s']:g}-s budget"]
    for name, part in report["parts"].items():
        lines.append(f"  {name:10s} {part['status']:10s} {part.get('seconds', 0):6.1f} s  {figures(name, part)}")
    for row in report.get("targets", []):
        verdict = {True: "MET", False: "NOT MET", None: "n/a"}[row["met"]]
        value = "not measured" if row["measured"] is None else f"{row['measured']:.3g} {row['unit']}".strip()
        lines.append(f"  target {verdict:8s} {row['target']} {row['threshold']}: {value}"
                     + ("" if row["applies"] else f" (at {row['at']}, not the target's sizes)"))
    lines.append("gpu-check: " + ("every part ran and every check passed" if report.get("ok") else "FAILED"))
    return lines


def figures(name: str, part: dict) -> str:
    """The figures of one part, in a line."""
    if name == "install":
        return (f"{len(part.get('installed', {}))} installed, {len(part.get('already_present', {}))} already there"
                + (f"; unmet: {part['unmet_requirements']}" if part.get("unmet_requirements") else ""))
    if name == "dataset":
        return f"{part.get('dataset')}: {part.get('episodes')} episodes" + (" (built)" if part.get("built") else "")
    if name == "exactness":
        return (f"{part.get('passed')} of {len(part.get('tests', []))} tests passed on {part.get('device')}"
                + (f"; failed: {part['failed']}" if part.get("failed") else ""))
    if name in ("planning", "compiled"):
        return "; ".join(_planning(run) for run in part.get("runs", []))
    if name == "triton":
        return "; ".join(_planning(run) + ", kernels a plan: " + ", ".join(
            f"{d} {k['gpu_kernels'] or k['aten_ops']}" for d, k in run.get("kernels_per_plan", {}).items())
            + ("" if all(same["bins"] for same in run.get("same_plan", {}).values()) else " (PLANS DIFFER)")
            for run in part.get("runs", []))
    if name == "training" and "device" in part:
        ratio = f", {part['speedup_vs_cpu']:.1f}x the CPU" if "speedup_vs_cpu" in part else ""
        return f"{part['device']['tokens_per_s']:,.0f} tokens/s{ratio}"
    if name == "rollouts" and "steps_per_s" in part:
        done = (f"{part['vectorized_s']:.1f} s" if "vectorized_s" in part else
                f"cut off after {part['planned_steps']} steps in {part['seconds']:.0f} s, projected "
                f"{part['projected_s']:.0f} s")
        return f"{part['episodes']} x {part['max_steps']} steps: {done} ({part['steps_per_s']:.0f} steps/s)"
    if name == "notebooks":
        outcomes = [r["status"] for r in part.get("results", {}).values()]
        return f"{part.get('mode')} mode: " + ", ".join(f"{outcomes.count(s)} {s}" for s in dict.fromkeys(outcomes))
    return ""


def _planning(run: dict) -> str:
    """One batch's plans: every decoder's time and share of the matmul rate, and what recording graphs cost."""
    decoders = ", ".join(f"{name} {d['ms_per_plan']['median']:.1f} ms ({d['share_of_matmul_rate']['median']:.2%})"
                         for name, d in run["decoders"].items())
    graphs = run.get("graphs") or run.get("compiled") or {}
    recorded = (f"; graphs recorded in {graphs['capture_s']:.2f} s" if graphs.get("graphs") else "") + (
        f"; CAPTURE FAILED: {graphs['failed']}" if graphs.get("failed") else "")
    return f"{run['dtype']} batch {run['batch']}: {decoders}{recorded}"
