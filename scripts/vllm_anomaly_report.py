"""Print the figures of docs/vllm-sampling-anomaly.md from the issue-37 scripts' JSON output.

    python3 scripts/vllm_anomaly_report.py tests/data/vllm_anomaly/

reads, from that folder, probe_seed.json (written by scripts/vllm_sampling_probe.py --out;
its key "control" is the --control pass), probe_noseed.json and probe_fix.json when present,
and live_*.json (the summary.json files of scripts/vllm_selfdraft_live.py), and prints
Markdown: for each run its date, machine and load, per-position acceptance, and for the
seeded probe the first verify steps position by position. Exit 2 when the folder or a
file is missing or unreadable.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

PROBES = (("probe_seed.json", "vLLM as shipped, per-request seed"),
          ("probe_noseed.json", "vLLM as shipped, no seed"),
          ("probe_fix.json", "control: expand_batch_to_tokens replaced (--fix-expand), per-request seed"))
LIVES = (("live_seed.json", "live server, temperature 0.8, per-request seed"),
         ("live_noseed.json", "live server, temperature 0.8, no seed"),
         ("live_greedy.json", "live server, temperature 0"),
         ("live_fix.json", "live server with the control patch, temperature 0.8, per-request seed"))


def _f(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def _when(d):
    m = d.get("machine", {})
    return f"{d.get('date')}, {m.get('cores')} cores, load average {m.get('load_avg_1m', 0):.1f}"


def probe_block(name, what, d) -> list[str]:
    s = d["summary"]
    out = [f"{what} ({name}; {_when(d)}):", "", "```",
           "position  tested  accepted  rate   expected at T  temp used = T  p NaN"]
    for p in s["per_position"]:
        out.append(f"{p['position']:>8}  {p['tested']:>6}  {p['accepted']:>8}  {_f(p['rate'])}  "
                   f"{_f(p['expected_rate_at_request_temp']):>13}  {p['temp_used_equal_request']:>13}  "
                   f"{p['p_target_nan']:>5}")
    out.append(f"tested {s['tested']}, accepted {s['accepted']}, expected at the request's temperature "
               f"{s['expected_accepts_at_request_temp']:.1f}")
    if d.get("trace"):
        t = d["trace"]
        out.append(f"trace: {t['rows']} step rows, {t['mismatch']} steps whose returned tokens differ "
                   "from what vLLM appended")
        if "vllm_counted" in t:
            out.append(f"drafted {t['drafted']}, accepted by the sampler {t['accepted']}, counted by vLLM's metrics "
                       f"{t['vllm_counted']}; steps with no token drawn after a rejection {t['no_drawn_token']}")
    if d.get("outputs"):
        out.append(f"first output: {d['outputs'][0]!r}")
    out += ["```", ""]
    return out


def steps_block(d, n=12) -> list[str]:
    out = ["First verify steps of the seeded probe, position by position:", "", "```",
           "request     step pos draft argmax  T used      p(vLLM)  p(T=0.8)  u      decision emitted"]
    for r in d["rows"][:n]:
        pv = "NaN" if r["p_target_nan"] else _f(r["p_target_vllm"], 4)
        out.append(f"{r['request'][:10]:<11} {r['step']:>4} {r['position']:>3} {r['drafted']:>5} "
                   f"{r['target_argmax']:>6}  {r['temp_used']:<10.3g}  {pv:>7}  {_f(r['p_target_at_request_temp'], 4)}"
                   f"    {_f(r['u'], 3)}  {r['decision'] or '(not tested)':<8} "
                   f"{'' if r['emitted'] is None else r['emitted']}")
    out += ["```", ""]
    return out


def live_block(name, what, d) -> list[str]:
    rates = ", ".join(_f(x) for x in d["rate_at_position"])
    return [f"- {what} ({name}; {_when(d)}): {d['verify_steps']} verify steps, per-position acceptance "
            f"{rates}; per_step_accepted takes the values {d['per_step_accepted_values']}"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: vllm_anomaly_report.py FOLDER (the issue-37 JSON files)", file=sys.stderr)
        return 2
    root = Path(argv[0])
    lines: list[str] = []
    try:
        seed = json.loads((root / "probe_seed.json").read_text())
        lines += steps_block(seed)
        for name, what in PROBES:
            if name == "probe_fix.json" and not (root / name).is_file() and "control" in seed:
                lines += probe_block("probe_seed.json, key control", what, seed["control"])
            elif (root / name).is_file() or name == "probe_seed.json":
                lines += probe_block(name, what, json.loads((root / name).read_text()))
        for name, what in LIVES:
            if (root / name).is_file():
                lines += live_block(name, what, json.loads((root / name).read_text()))
    except (OSError, ValueError, KeyError) as e:
        print(f"vllm_anomaly_report: {root}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
