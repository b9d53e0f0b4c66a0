"""The chat template: how /v1/chat/completions turns messages into the byte-level prompt.

The embedded model has no chat tokens; this plain, documented template is all there is:

    <role>: <content>\\n        one line group per message, in order
    assistant:                  then this, and the model continues from here

    >>> render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    'system: Be brief.\\nuser: hi\\nassistant: '

Content is a string, or a list of {"type": "text", "text": ...} parts (joined without a
separator); other part types (images, audio) are refused. Roles: system, developer,
user, assistant, tool.
"""
from __future__ import annotations

ROLES = ("system", "developer", "user", "assistant", "tool")
ASSISTANT_PREFIX = "assistant: "


def content_text(content) -> str:
    """A message's content as text. Raises ValueError naming what is unsupported."""
    if isinstance(content, str):
        return content
    parts = []
    for p in content:
        if p.get("type") != "text" or not isinstance(p.get("text"), str):
            raise ValueError(f"content part of type {str(p.get('type'))[:40]!r}: only text parts are supported")
        parts.append(p["text"])
    return "".join(parts)


def render(messages: list[dict]) -> str:
    """The prompt text for `messages` (dicts with role and content)."""
    return "".join(f"{m['role']}: {content_text(m['content'])}\n" for m in messages) + ASSISTANT_PREFIX
