"""Grafana dashboard, provisioning files and Prometheus alert rules for `specaudit serve`.

Data files only (installed as package data of specaudit.dashboards):
    specaudit.json                      the dashboard (uid specaudit-spec-decoding)
    provisioning/dashboards/*.yml       Grafana file provisioning of the dashboard
    provisioning/datasources/*.yml      a Prometheus data source for a fresh Grafana
    alerts.yml, alerts_test.yml         alerting rules and their promtool unit tests
    prometheus.yml                      a scrape config for one server, loading alerts.yml
"""
from importlib import resources


def path(name: str = ""):
    """The installed location of a file of this folder, e.g. path("alerts.yml")."""
    return resources.files(__name__).joinpath(name)
