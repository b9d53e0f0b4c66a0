"""Text <-> tokens for the OpenAI-compatible endpoints: the embedded byte tokenizer, or a
Hugging Face tokenizer when the server runs `--target hf:PATH`.

    codec.encode(text)             prompt text -> token ids (completions)
    codec.chat(messages)           chat messages -> token ids (the model's chat template)
    codec.decode(ids)              output ids -> text (EOS and other special tokens dropped)
    d = codec.stream_decoder()     per-step text deltas: d.push(ids) -> str, d.flush() -> str
    codec.vocab_size               token ids a prompt may hold are 0..vocab_size-1

Bytes: every UTF-8 byte is one token, EOS is byte 0; the chat template is chat.py's.
Hugging Face: completions add the tokenizer's special tokens as vLLM does (a BOS where the
model has one); chat uses the tokenizer's own chat template when it has one (the template
writes its BOS), else chat.py's plain template. Streaming decodes a sliding window of the
output (TGI's prefix/read offsets): a token that ends inside a multi-byte character
(the decoder shows U+FFFD) waits for the next step, so a stream's deltas join to exactly
decode(all ids).
"""
from __future__ import annotations

import codecs

from specaudit.serve.chat import content_text, render


class ByteCodec:
    """The embedded models' tokenizer: token id = UTF-8 byte, 0 = EOS."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))      # UnicodeEncodeError on a lone surrogate

    def chat(self, messages: list[dict]) -> list[int]:
        return self.encode(render(messages))

    def decode(self, ids) -> str:
        from specaudit.tokenizer import decode
        return decode(ids)

    def stream_decoder(self):
        return _ByteStream()


class _ByteStream:
    def __init__(self):
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids) -> str:
        # bytes -> text across step boundaries: a UTF-8 character may span two steps
        return self._dec.decode(bytes(t for t in ids if 0 < t < 256))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class HFCodec:
    """A transformers tokenizer behind the same calls."""

    def __init__(self, tokenizer, vocab_size: int | None = None):
        self.tok = tokenizer
        self.vocab_size = int(vocab_size or len(tokenizer))
        self.has_template = bool(getattr(tokenizer, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        text.encode("utf-8")                    # a lone surrogate: UnicodeEncodeError, as for bytes
        return list(self.tok(text, add_special_tokens=True)["input_ids"])

    def chat(self, messages: list[dict]) -> list[int]:
        msgs = [{"role": m["role"], "content": content_text(m["content"])} for m in messages]
        if not self.has_template:
            return list(self.tok(render(msgs), add_special_tokens=True)["input_ids"])
        text = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        text.encode("utf-8")
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def stream_decoder(self):
        return _HFStream(self)


class _HFStream:
    """Incremental detokenization (TGI's decode_token): decode ids[prefix:] and emit what
    follows the text of ids[prefix:read]; hold back while the tail is an unfinished
    character."""

    def __init__(self, codec: HFCodec):
        self.c = codec
        self.ids: list[int] = []
        self.prefix = 0   # window start: a few tokens of context so spaces/merges decode right
        self.read = 0     # ids[:read] are already emitted

    def push(self, ids) -> str:
        self.ids.extend(int(t) for t in ids)
        before = self.c.decode(self.ids[self.prefix:self.read])
        now = self.c.decode(self.ids[self.prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return now[len(before):]
        return ""

    def flush(self) -> str:
        before = self.c.decode(self.ids[self.prefix:self.read])
        now = self.c.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return now[len(before):]
