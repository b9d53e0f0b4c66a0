"""Grafana dashboards, provisioning files and Prometheus rules: `specaudit serve` and real engines.

Data files (installed as package data of specaudit.dashboards; `specaudit dashboards
--out DIR` copies them with export()):
    specaudit.json                      the dashboard (uid specaudit-spec-decoding)
    provisioning/dashboards/*.yml       Grafana file provisioning of the dashboard
    provisioning/datasources/*.yml      a Prometheus data source for a fresh Grafana
    alerts.yml, alerts_test.yml         alerting rules and their promtool unit tests
    prometheus.yml                      a scrape config for one server, loading alerts.yml
    engines.json                        the real-engines dashboard (uid specaudit-engines)
    engines_rules.yml, engines_alerts.yml, engines_alerts_test.yml
                                        recording rules, alerts and promtool tests for vLLM,
                                        SGLang, TensorRT-LLM and llama.cpp metrics
    prometheus_engines.yml              a scrape config for the four engines, loading both
The engines_* files are rendered by engines.py (`python3 -m specaudit.dashboards.engines`).
"""
from importlib import resources


def path(name: str = ""):
    """The installed location of a file of this folder, e.g. path("alerts.yml")."""
    return resources.files(__name__).joinpath(name)


# What `specaudit dashboards --out DIR` writes (paths inside this folder and inside DIR).
BUNDLE = ("engines.json", "engines_rules.yml", "engines_alerts.yml", "engines_alerts_test.yml",
          "prometheus_engines.yml", "specaudit.json", "alerts.yml", "alerts_test.yml", "prometheus.yml",
          "provisioning/dashboards/specaudit.yml", "provisioning/datasources/prometheus.yml")
PROVISION_PATH = "      path: /var/lib/grafana/dashboards/specaudit\n"


def _umask_mode() -> int:
    """0666 less the process umask: the mode open() would give a new file."""
    import os
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def export(out, force: bool = False) -> list:
    """Copy the dashboards, rules, their promtool tests, the scrape examples and Grafana's
    provisioning files into `out`; the provisioning file points Grafana at `out` itself.
    Refuses (FileExistsError naming them) to replace files that differ unless force; writes
    every file to a temporary name first, so an error leaves no half-written file."""
    import os
    import tempfile
    from pathlib import Path
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} exists and is not a folder")
    texts = {}
    for name in BUNDLE:
        text = path(name).read_text()
        if name == "provisioning/dashboards/specaudit.yml":
            if PROVISION_PATH not in text:
                raise RuntimeError("provisioning/dashboards/specaudit.yml has no dashboards path to set")
            text = text.replace(PROVISION_PATH, f"      path: {out}\n")
        texts[name] = text
    clash = [n for n, t in texts.items() if (out / n).exists() and (out / n).read_text() != t]
    if clash and not force:
        raise FileExistsError(f"would replace {len(clash)} changed file(s) in {out} ({', '.join(clash[:3])}"
                              f"{', ...' if len(clash) > 3 else ''}); pass --force")
    written, tmps = [], []
    try:
        for name, text in texts.items():
            dest = out / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
            tmps.append(tmp)
            os.fchmod(fd, _umask_mode())    # mkstemp makes 0600; Grafana may run as another user
            with os.fdopen(fd, "w") as f:
                f.write(text)
        for name, tmp in zip(texts, tmps):
            os.replace(tmp, out / name)
            written.append(out / name)
    finally:
        for tmp in tmps:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return written
