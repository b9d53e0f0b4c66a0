"""Post-mortems: DuckDB views over trace datasets (views.py), canned SQL (queries/), the HTML report."""
