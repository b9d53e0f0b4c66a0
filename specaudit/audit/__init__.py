"""Reading traces and engine output: every module here answers "is this figure true?".

    check/         the invariant checker engine (the catalog lives in invariants/)
    formats.py     findings as text, json, junit, github, sarif
    findings.py    the Finding every reader reports
    reference.py   a per-row Python oracle of the step rules (tests, benchmarks)
    estimate.py    the throughput-derived commit-length estimator (`specaudit estimate`), with
                   estimate_model.py, cost_profile.py, observed_throughput.py, estimate_judge.py
    calibrate.py   cost profiles for the estimator, measured on the reference models
    diff.py        which of draft, verify or metric diverged between two runs
    ab.py          A/B experiments
    sources/       engine logs and Prometheus text (SGLang, vLLM, ...)

Readers share specaudit.trace.schema and never import each other's internals.
"""
