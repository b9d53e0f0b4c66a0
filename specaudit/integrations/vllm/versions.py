"""The vLLM versions the plugin's hooks were written and tested against.

The hooks read private attributes of vLLM's scheduler and model runner (hooks.py names
each one). Those change between releases without notice, so a version not listed here
is refused (plugin.register raises one line naming the supported versions) rather than
traced wrongly. Add a version only after tests/test_vllm_live.py passed against it."""
from __future__ import annotations

SUPPORTED = ("0.32.0",)


def base_version(v: str) -> str:
    """'0.32.0+cpu' / '0.32.0.post1' -> '0.32.0' (the upstream code version)."""
    v = (v or "").split("+", 1)[0]
    parts = v.split(".")
    return ".".join(parts[:3])


def refusal(v: str) -> str | None:
    """None when the plugin knows vLLM version `v`, else the one-line reason it refuses."""
    if base_version(v) in SUPPORTED:
        return None
    return (f"specaudit vLLM plugin: vLLM {v or '(unknown version)'} is not supported (supported: "
            f"{', '.join(SUPPORTED)}); unset SPECAUDIT_VLLM_TRACE to serve untraced, or use a supported vLLM")
