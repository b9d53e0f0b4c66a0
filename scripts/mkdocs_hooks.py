"""MkDocs hook (mkdocs.yml `hooks:`): every generated rule page in the nav.

docs/rules/<CODE>.md are written by scripts/render_docs.py, one per rule of the catalog;
listing them by hand in mkdocs.yml would go stale with each new rule, so the `Rules`
section of the nav gets them here, in code order, after its index.
"""
from __future__ import annotations

from pathlib import Path


def on_config(config, **kwargs):
    rules = sorted(p.name for p in (Path(config["docs_dir"]) / "rules").glob("SA*.md"))
    for item in config["nav"] or []:
        if isinstance(item, dict) and "Rules" in item:
            item["Rules"] = [x for x in item["Rules"] if not (isinstance(x, dict) and len(x) == 1
                                                          and str(next(iter(x.values()))).startswith("rules/SA"))]
            item["Rules"] += [{name[:-3]: f"rules/{name}"} for name in rules]
    return config
