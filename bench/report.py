"""The benchmark's markdown report: the tables docs/benchmarks.md quotes, from the results `bench.run` gathered."""

from __future__ import annotations

from typing import Any

from bench import billing, fixed_cost, long_run, retention


def _ms(value: float) -> str:
    return f"{value:.2f} ms"


def _ratio(value: float) -> str:
    return f"{value:.2f}x"


def _label(row: dict[str, Any]) -> str:
    return f"{row['payload']} ({row['body_bytes'] / 1024:.0f} KiB){', streamed: time to first byte' * row['stream']}"


def latency_table(rows: list[dict[str, Any]]) -> list[str]:
    """The latency table's lines: its header, then one line per summarized row (`bench.run.summarize_latency`)."""
    lines = [
        "| request | concurrency | direct p50 / p99 | bare relay added p50 / p99 | proxy added p50 / p99 "
        "| proxy compacting added p50 / p99 | req/s direct / relay / proxy / compacting "
        "| proxy vs relay (p50, req/s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        compacting = (
            f"{_ms(row['compacting_added_p50_ms'])} / {_ms(row['compacting_added_p99_ms'])}"
            if "compacting_added_p50_ms" in row
            else "-"
        )
        compacting_rps = f" / {row['compacting_rps']:.0f}" if "compacting_rps" in row else ""
        lines.append(
            f"| {_label(row)} | {row['concurrency']} | {_ms(row['direct_p50_ms'])} / {_ms(row['direct_p99_ms'])} "
            f"| {_ms(row['relay_added_p50_ms'])} / {_ms(row['relay_added_p99_ms'])} "
            f"| {_ms(row['proxy_added_p50_ms'])} / {_ms(row['proxy_added_p99_ms'])} | {compacting} "
            f"| {row['direct_rps']:.0f} / {row['relay_rps']:.0f} / {row['proxy_rps']:.0f}{compacting_rps} req/s "
            f"| {_ratio(row['proxy_vs_relay_p50'])} latency, {_ratio(row['relay_vs_proxy_rps'])} fewer req/s |"
        )
    return lines


def render(results: dict[str, Any]) -> str:
    """The markdown report."""
    lines: list[str] = []
    machine = results["machine"]
    lines.append(
        f"Machine: {machine['cores']} cores ({machine['cpu']}), Python {machine['python']}, {machine['system']}; "
        f"command `{results['command']}`; total {results['seconds']:.0f} s."
    )
    lines.append("")
    lines.append("### Added latency over direct calls to an instant loopback upstream")
    lines.append("")
    lines += latency_table(results["latency"])
    problems = [problem for row in results["latency"] for problem in row["problems"]]
    if problems:
        lines.append("")
        lines.append(f"Problems: {'; '.join(problems)}")
    lines.append("")
    lines += _fixed_cost_lines(results["fixed_cost"])
    lines += _memory_lines(results)
    lines += _peer_lines(results)
    lines += _resend_wire_lines(results["resend_wire"])
    lines += _target_lines(results)
    lines.append(f"### Long tool-using run through the proxy ({long_run.WINDOW}-token window)")
    lines.append("")
    lines.append(
        "| rewrite memory | turns | compacted turns | mean identical prefix share "
        "| turns extending the previous prompt | prompt tokens forwarded | of which cached | largest prompt |"
    )
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in results["long_run"]:
        lines.append(
            f"| {'on' if row['rewrite_memory'] else 'off'} | {row['turns']} | {row['compacted_turns']} "
            f"| {row['mean_identical_prefix_share'] * 100:.1f} % | {row['turns_fully_extending_previous']} "
            f"| {row['prompt_tokens_forwarded']} tokens | {row['cached_share'] * 100:.1f} % "
            f"| {row['max_prompt_tokens']} tokens |"
        )
    lines.append("")
    lines.append("### What the provider bills for the long run, through the proxy and direct up to its overflow")
    lines.append("")
    lines += billing.table([row for row in results["long_run"] if "billing" in row])
    lines.append("")
    lines.append("### Compaction decision on a large conversation (`bench.resend`, no sockets)")
    lines.append("")
    figures = results["resend"]
    lines.append("| conversation | body | cold decision | re-sent + 2 messages | re-sent / cold |")
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    lines.append(
        f"| {figures['tokens']} tokens, {figures['messages']} messages | {figures['body_bytes'] / 1024 / 1024:.2f} MiB "
        f"| {_ms(figures['cold_ms'])} | {_ms(figures['resend_ms'])} | {figures['resend_fraction'] * 100:.1f} % |"
    )
    lines.append("")
    hook = results["hook_vs_haystack"]
    settings = hook["settings"]
    lines.append(
        f"### Our hook vs Haystack's `CompactionHook` (`bench.hook_vs_haystack`: {settings['steps']} steps, "
        f"{settings['window']}-token window, CPU time)"
    )
    lines.append("")
    lines.append("| compactor / counter / usage | ours per call | Haystack per call | Haystack / ours |")
    lines.append("| --- | ---: | ---: | ---: |")
    for row in hook["rows"]:
        ours, theirs = row["ours"]["ms_per_call"], row["haystack"]["ms_per_call"]
        label = f"{row['compactor']} / {row['counter']} / {'usage' if row['usage'] else 'no usage'}"
        speedup = theirs / ours if ours else float("inf")
        lines.append(f"| {label} | {_ms(ours)} | {_ms(theirs)} | {_ratio(speedup)} |")
    return "\n".join([*lines, "", *retention.render(results["retention"])])


def _fixed_cost_lines(figures: dict[str, Any]) -> list[str]:
    """The proxy against the bare relay on the same event loop: small requests, 32 clients and one; streamed events."""
    lines = ["### The fixed cost: the proxy against the bare relay, on the same event loop", ""]
    lines += fixed_cost.table(figures)
    problems = [
        problem
        for loop in figures.values()
        for row in [*loop["requests"], loop["events"]]
        for problem in row["problems"]
    ]
    if problems:
        lines += ["", f"Problems: {'; '.join(problems)}"]
    return [*lines, ""]


def _peer_lines(results: dict[str, Any]) -> list[str]:
    """The LiteLLM table (non-streamed rows), or the note saying how to add it."""
    rows = [row for row in results["latency"] if "litellm_rps" in row]
    if not rows:
        return [results.get("litellm_note") or "LiteLLM's proxy was not measured in this run.", ""]
    lines = [
        "### Against LiteLLM's proxy (same upstream, same load, its own virtual environment)",
        "",
        "| request | concurrency | LiteLLM p50 | proxy p50 | LiteLLM req/s | proxy req/s | proxy / LiteLLM req/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        proxy_p50 = row["direct_p50_ms"] + row["proxy_added_p50_ms"]
        lines.append(
            f"| {_label(row)} | {row['concurrency']} | {_ms(row['litellm_p50_ms'])} | {_ms(proxy_p50)} "
            f"| {row['litellm_rps']:.1f} | {row['proxy_rps']:.0f} | {_ratio(row['proxy_vs_litellm_rps'])} |"
        )
    return [*lines, ""]


def _memory_lines(results: dict[str, Any]) -> list[str]:
    """Resident memory per in-flight very large request, the proxy's (re-sent and first sight) and the relay's."""
    lines: list[str] = []
    lines.append("### Resident memory (VmRSS) while very large requests wait on a slow upstream")
    lines.append("")
    rounds = results.get("plan", {}).get("rounds", 1)
    processes = f"{rounds} fresh processes" if rounds != 1 else "1 fresh process"
    lines.append(f"Each row is the median over {processes}, by the per-request figure.")
    lines.append("")
    lines.append(
        "| process | conversation | in flight | body | idle at start | warm | peak | after the answers "
        "| per in-flight request | per request / body |"
    )
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in results["memory"]:
        lines.append(
            f"| {row['relay']} | {row.get('conversation', 'first sight')} | {row['in_flight']} "
            f"| {row['body_mib']:.2f} MiB | {row['idle_mib']:.1f} MiB "
            f"| {row['warm_mib']:.1f} MiB | {row['peak_mib']:.1f} MiB | {row['after_mib']:.1f} MiB "
            f"| {row['per_request_mib']:.2f} MiB | {_ratio(row['per_request_mib'] / row['body_mib'])} |"
        )
    lines.append("")
    return lines


def _resend_wire_lines(figures: dict[str, Any]) -> list[str]:
    """The re-sent conversation through the whole proxy against the relay forwarding the same bytes."""
    ratios = figures.get("ratios", [figures["proxy_vs_relay"]])
    spread = f"{len(ratios)} rounds, the median shown; proxy / relay {min(ratios):.2f}x to {max(ratios):.2f}x"
    return [
        "### A conversation re-sent with two new messages, through the whole proxy (`bench.resend_wire`)",
        "",
        f"{spread}.",
        "",
        "| conversation | body | turns | bare relay p50 | proxy p50 | proxy / relay | proxy decided |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| {figures['tokens']} tokens, {figures['messages']} messages | {figures['body_bytes'] / 2**20:.2f} MiB "
        f"| {figures['turns']} | {_ms(figures['relay_p50_ms'])} | {_ms(figures['proxy_p50_ms'])} "
        f"| {_ratio(figures['proxy_vs_relay'])} "
        f"| {', '.join(f'{name} {count}' for name, count in figures['x_compaction'].items())} |",
        "",
    ]


def _target_lines(results: dict[str, Any]) -> list[str]:
    """Issue 13's must-show targets, each with what this run reached: met or not, never rounded into a pass."""
    latency = results["latency"]
    rps = min(row["proxy_vs_relay_rps"] for row in latency)
    p50 = max(row["proxy_vs_relay_p50"] for row in latency)
    memory: dict[str, float] = {}
    for row in results["memory"]:
        if row["relay"] == "proxy":
            case = row.get("conversation", "first sight")
            memory[case] = max(memory.get(case, 0.0), row["per_request_mib"] / row["body_mib"])
    wire = results["resend_wire"]["proxy_vs_relay"]
    checks = [
        ("proxy req/s at least 0.8 of the relay's, every row", f"lowest {rps:.2f}", rps >= 0.8),
        ("proxy p50 at most 1.25 of the relay's, every row", f"highest {p50:.2f}", p50 <= 1.25),
        ("re-sent conversation through the proxy within 1.5x the relay", f"{wire:.2f}x", wire <= 1.5),
        *(
            (f"memory per in-flight very large request at most 1.5x its body ({case})", f"highest {x:.2f}x", x <= 1.5)
            for case, x in sorted(memory.items(), reverse=True)
        ),
    ]
    checks += fixed_cost.targets(results["fixed_cost"])
    peers = [row["proxy_vs_litellm_rps"] for row in latency if "proxy_vs_litellm_rps" in row]
    if peers:
        checks.append(("proxy req/s at least 15x LiteLLM's, every row", f"lowest {min(peers):.1f}x", min(peers) >= 15))
    lines = ["### Targets (issues 13 and 38) in this run", "", "| target | reached | met |", "| --- | ---: | --- |"]
    lines += [f"| {target} | {reached} | {'yes' if met else 'no'} |" for target, reached, met in checks]
    return [*lines, ""]
