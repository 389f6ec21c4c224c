"""Writes a load-test script's report: its figures beside what a reader needs to judge and
rerun them. Called by `write_report` in loadtest/lib.sh (standard library only).

    python3 loadtest/report.py FIGURES.json [RUNS.tsv RATIO...] > report.json
    python3 loadtest/report.py --summary report.json     (what a script prints at its end)

FIGURES.json  the script's own figures (a JSON object), kept as they are; or FIGURES.md,
              the table a script prints, kept line by line (`printed`); or FIGURES.jsonl,
              one JSON object a round, kept as `rounds` with the median and range of
              each of their numbers.
RUNS.tsv      every timed run, one a line: round, name, requests a second, p99 in ms, then
              any further figures of the run as FIELD=NUMBER (e.g. server_us=28.7).
RATIO         NAME=A/B: per round, A's mean requests a second over B's (the runs of a round
              go A B B A, so drift within it falls on both sides alike); NAME=A/B:FIELD
              compares that figure instead. Reported with every round's value, the median
              and the range.

The header comes from the environment lib.sh sets: REPORT_COMMAND, REPORT_BEGAN,
REPORT_STAT0 (the first line of /proc/stat when the measured part began), REPORT_SETTINGS
(every setting that differs from the default), REPORT_COMMIT, REPORT_TREE_CHANGED.
"""

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys


def steal_percent(before, after):
    """The share of all CPU time the hypervisor took from this VM between two readings of
    /proc/stat's `cpu` line (user nice system idle iowait irq softirq steal): above a few
    percent the figures are not the machine's own."""
    first = [int(x) for x in before.split()[1:9]]
    last = [int(x) for x in after.split()[1:9]]
    spent = [b - a for a, b in zip(first, last)]
    return round(100 * spent[7] / max(sum(spent), 1), 2)


def cpu_model():
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def memory_gib():
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def os_name():
    try:
        with open("/etc/os-release") as release:
            for line in release:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def rustc():
    try:
        return subprocess.run(["rustc", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def rounds(path, ratios):
    """The runs, and for each RATIO its value in each round, median and range."""
    runs = []
    with open(path) as tsv:
        for line in tsv:
            if line.strip():
                round_, name, rps, p99, *more = line.rstrip("\n").split("\t")
                run = {"round": int(round_), "name": name, "rps": float(rps), "p99_ms": round(float(p99), 2)}
                for pair in more:
                    field, value = pair.split("=", 1)
                    run[field] = float(value)
                runs.append(run)
    figures = {"runs": runs, "ratios": {}}
    for spec in ratios:
        label, pair = spec.split("=", 1)
        pair, _, field = pair.partition(":")
        field = field or "rps"
        a, b = pair.split("/", 1)
        per_round = []
        for r in sorted({run["round"] for run in runs}):
            has = lambda x, name: x["round"] == r and x["name"] == name and field in x
            mean = {
                name: statistics.mean(x[field] for x in runs if has(x, name))
                for name in (a, b)
                if any(has(x, name) for x in runs)
            }
            if len(mean) == 2:
                per_round.append(round(mean[a] / mean[b], 3))
        if not per_round:
            sys.exit(f"report.py: no round has runs of both {a} and {b}")
        figures["ratios"][label] = {
            "of": a,
            "to": b,
            "figure": field,
            "per_round": per_round,
            "median": round(statistics.median(per_round), 2),
            "range": [round(min(per_round), 2), round(max(per_round), 2)],
        }
    return figures


def over_rounds(path):
    """Rounds of figures (one JSON object a line), with each number's median and range."""
    with open(path) as jsonl:
        rows = [json.loads(line) for line in jsonl if line.strip()]
    numbers = [k for k, v in rows[0].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round"]
    return {
        "rounds": rows,
        "median": {k: statistics.median(row[k] for row in rows) for k in numbers},
        "range": {k: [min(row[k] for row in rows), max(row[k] for row in rows)] for k in numbers},
    }


def summary(path):
    """Each ratio's median and range, and each run's median requests a second and p99."""
    with open(path) as f:
        report = json.load(f)
    figures = report["figures"]
    machine = report["machine"]
    print(f"{report['command']} at {report['commit'][:7]}, {report['began']}, "
          f"{machine['nproc']} cores, {machine['steal_percent']}% stolen")
    for label, ratio in figures.get("ratios", {}).items():
        low, high = ratio["range"]
        print(f"  {label}: {ratio['median']} (range {low}-{high}, {len(ratio['per_round'])} rounds)")
    names = dict.fromkeys(run["name"] for run in figures.get("runs", []))
    for name in names:
        runs = [run for run in figures["runs"] if run["name"] == name]
        rps = statistics.median(run["rps"] for run in runs)
        p99 = round(statistics.median(run["p99_ms"] for run in runs), 2)
        fields = dict.fromkeys(f for run in runs for f in run if f not in ("round", "name", "rps", "p99_ms"))
        more = {field: statistics.median(run[field] for run in runs if field in run) for field in fields}
        extra = "".join(f", {field} {value:g}" for field, value in more.items())
        print(f"  {name}: {rps:,.0f} req/s, p99 {p99} ms{extra} (median of {len(runs)} runs)")
    other = {k: v for k, v in figures.items() if k not in ("runs", "ratios")}
    if other:
        print("  " + json.dumps(other))


def main():
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
        return
    if sys.argv[1].endswith(".jsonl"):
        figures = over_rounds(sys.argv[1])
    else:
        with open(sys.argv[1]) as f:
            figures = {"printed": f.read().splitlines()} if sys.argv[1].endswith(".md") else json.load(f)
    if len(sys.argv) > 2:
        figures.update(rounds(sys.argv[2], sys.argv[3:]))
    with open("/proc/stat") as stat:
        now = stat.readline()
    env = os.environ
    report = {
        "command": env["REPORT_COMMAND"],
        "commit": env["REPORT_COMMIT"],
        "tree_changed": env["REPORT_TREE_CHANGED"] != "0",
        "began": env["REPORT_BEGAN"],
        "ended": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "nproc": os.cpu_count(),
            "cpu_model": cpu_model(),
            "memory_gib": memory_gib(),
            "os": os_name(),
            "kernel": platform.release(),
            "rustc": rustc(),
            "steal_percent": steal_percent(env["REPORT_STAT0"], now),
        },
        "settings_changed": json.loads(env["REPORT_SETTINGS"]),
        "figures": figures,
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
