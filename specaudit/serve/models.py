"""Request and response bodies of the API, as pydantic models, and the one function
that turns a request body into a validated job description or an HTTPError.

Decoding is greedy (that is what makes speculative decoding lossless here): sampling
options are accepted only at their greedy values, never silently ignored.

Words:
    body       the raw bytes the client sent
    Parsed     what the engine needs: prompt tokens (bytes, 0..255), max_tokens,
               stream, include_usage, and whether it is a chat request
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specaudit.serve.errors import HTTPError, short

DEFAULT_MAX_TOKENS = 16     # OpenAI's default when max_tokens is omitted


class _Strict(BaseModel):
    """Unknown fields are an error; types are not coerced ("8" is not 8, true is not 1)."""
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None   # vLLM's; accepted only as false


class _Common(_Strict):
    model: str | None = None
    max_tokens: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    user: str | None = None
    # vLLM's extensions that benchmark clients send (AIPerf's --extra-inputs ignore_eos)
    ignore_eos: bool | None = None
    min_tokens: int | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]
    best_of: int | None = None
    echo: bool | None = None
    logprobs: int | None = None
    suffix: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)   # name, tool_call_id ...: harmless
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict]


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


# ------------------------------------------------------------------ responses

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None


class ChatMessageOut(BaseModel):
    role: str = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: str | None


class Delta(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: str | None = None


class _Response(BaseModel):
    """The envelope every response shares; a subclass sets `object` and the choices' type
    (pydantic keeps a redefined field at its place here, so the JSON keys keep this order)."""
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list
    usage: Usage | None = None
    metrics: dict | None = None           # {"speculative_decoding": {...}} (spec.py)


class CompletionResponse(_Response):
    object: str = "text_completion"
    choices: list[CompletionChoice]


class ChatResponse(_Response):
    object: str = "chat.completion"
    choices: list[ChatChoice]


class ChatChunk(_Response):
    object: str = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


# -------------------------------------------------------------------- parsing

@dataclass
class Parsed:
    prompt: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    chat: bool


def load_json(body: bytes):
    """The body as a JSON value, or HTTPError 400 for anything a client could send wrong:
    bad syntax, bytes that are not UTF-8, a number too long to read, nesting too deep."""
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise HTTPError(400, f"malformed JSON body: {e.msg} at line {e.lineno} column {e.colno}",
                        "invalid_json") from None
    except UnicodeDecodeError as e:
        raise HTTPError(400, f"the body is not UTF-8: {e.reason} at byte {e.start}", "invalid_json") from None
    except RecursionError:
        raise HTTPError(400, "malformed JSON body: nested too deeply", "invalid_json") from None
    except ValueError as e:   # "Exceeds the limit (4300 digits) for integer string conversion"
        raise HTTPError(400, f"malformed JSON body: {str(e).split(';')[0][:120]}", "invalid_json") from None


def _validation_error(e: ValidationError) -> HTTPError:
    errs = e.errors(include_url=False, include_input=False)
    extra = [".".join(map(str, x["loc"])) for x in errs if x["type"] == "extra_forbidden"]
    if extra:
        return HTTPError(422, f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra[:8]))}",
                         "unknown_field", extra[0])
    x = errs[0]
    loc = ".".join(str(p) for p in x["loc"] if not str(p).startswith(("function-", "list[", "str")))
    loc = loc or ".".join(map(str, x["loc"]))
    param = str(x["loc"][0]) if x["loc"] else None
    if x["type"] == "missing":
        return HTTPError(422, f"{loc}: required", "missing_field", param)
    return HTTPError(422, f"{loc}: {x['msg'][:160]}", "invalid_type", param)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check(name: str, value, ok: bool, why: str) -> None:
    if value is not None and not ok:
        raise HTTPError(422, f"{name}: {why} (got {short(value)})", "unsupported_value", name)


def _greedy_only(r: _Common) -> None:
    """Sampling and output options at their greedy / single-choice values, else 422."""
    fin = lambda v: math.isfinite(v)
    _check("temperature", r.temperature, r.temperature is None or (fin(r.temperature) and r.temperature == 0),
           "this server decodes greedily; use 0 or omit it")
    _check("top_p", r.top_p, r.top_p is None or r.top_p == 1, "this server decodes greedily; use 1 or omit it")
    _check("n", r.n, r.n == 1 or r.n is None, "one choice per request")
    _check("presence_penalty", r.presence_penalty, r.presence_penalty in (None, 0), "penalties are not supported")
    _check("frequency_penalty", r.frequency_penalty, r.frequency_penalty in (None, 0), "penalties are not supported")
    _check("logit_bias", r.logit_bias, r.logit_bias in (None, {}), "logit_bias is not supported")
    _check("stop", r.stop, r.stop in (None, "", []), "stop sequences are not supported (the model stops at EOS)")
    _check("min_tokens", r.min_tokens, r.min_tokens in (None, 0), "min_tokens is not supported")
    _check("ignore_eos", r.ignore_eos, not r.ignore_eos, "the model stops at EOS; ignore_eos is not supported")
    if isinstance(r, CompletionRequest):
        _check("best_of", r.best_of, r.best_of in (None, 1), "one choice per request")
        _check("echo", r.echo, r.echo in (None, False), "echo is not supported")
        _check("logprobs", r.logprobs, r.logprobs is None, "logprobs are not supported")
        _check("suffix", r.suffix, r.suffix is None, "suffix is not supported")
    else:
        _check("logprobs", r.logprobs, r.logprobs in (None, False), "logprobs are not supported")
        _check("top_logprobs", r.top_logprobs, r.top_logprobs in (None, 0), "logprobs are not supported")
    if r.stream_options is not None:
        _check("stream_options", r.stream_options.continuous_usage_stats,
               not r.stream_options.continuous_usage_stats, "continuous_usage_stats is not supported")


def _utf8(encode, param: str) -> list[int]:
    """encode() -> tokens, or HTTPError 400 when the text is not valid Unicode."""
    try:
        return encode()
    except UnicodeEncodeError as e:   # a lone surrogate such as "\ud800"
        raise HTTPError(400, f"{param}: not valid Unicode ({e.reason} at character {e.start})",
                        "invalid_unicode", param) from None


def parse_request(body: bytes, *, chat: bool, model: str, max_tokens_limit: int, context: int,
                  codec=None) -> Parsed:
    """Validate a /v1/completions (chat=False) or /v1/chat/completions body. Raises
    HTTPError with the status errors.py lists. `codec` turns text into tokens
    (serve/codec.py; default: the embedded byte tokenizer)."""
    if codec is None:
        from specaudit.serve.codec import ByteCodec
        codec = ByteCodec()
    obj = load_json(body)
    if not isinstance(obj, dict):
        raise HTTPError(400, "the body must be a JSON object", "invalid_json")
    cls = ChatRequest if chat else CompletionRequest
    try:
        r = cls.model_validate(obj)
    except ValidationError as e:
        raise _validation_error(e) from None
    except RecursionError:
        raise HTTPError(400, "the body is nested too deeply", "invalid_json") from None
    if r.model is not None and r.model != model:
        raise HTTPError(404, f"model {short(r.model)} is not served here; GET /v1/models lists {model!r}",
                        "model_not_found", "model")
    if chat:
        try:
            tokens = _utf8(lambda: codec.chat([m.model_dump() for m in r.messages]), "messages")
        except ValueError as e:
            raise HTTPError(422, f"messages: {e}", "unsupported_value", "messages") from None
    else:
        p = r.prompt
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            p = p[0]                                  # ["text"]: one prompt in a list
        if isinstance(p, str):
            tokens = _utf8(lambda: codec.encode(p), "prompt")
        elif p and all(_is_int(t) for t in p):
            if not all(0 <= t < codec.vocab_size for t in p):
                what = "bytes, 0..255" if codec.vocab_size == 256 else f"within 0..{codec.vocab_size - 1}"
                raise HTTPError(422, f"prompt: token ids are {what}", "invalid_value", "prompt")
            tokens = list(p)
        elif not p:
            tokens = []
        else:
            raise HTTPError(422, "prompt: a string, a list with one string, or a list of token ids "
                                 "(several prompts per request are not supported)", "invalid_type", "prompt")
        if not tokens:
            raise HTTPError(422, "prompt: empty", "invalid_value", "prompt")
    name, mt = "max_tokens", r.max_tokens
    if chat and r.max_completion_tokens is not None:
        if mt is not None and mt != r.max_completion_tokens:
            raise HTTPError(422, "max_tokens and max_completion_tokens disagree; send one", "invalid_value",
                            "max_completion_tokens")
        name, mt = "max_completion_tokens", r.max_completion_tokens
    if mt is None:
        mt = min(DEFAULT_MAX_TOKENS, max_tokens_limit, max(1, context - len(tokens)))
    elif not 1 <= mt <= max_tokens_limit:
        raise HTTPError(422, f"{name}: must be within 1..{max_tokens_limit} (got {short(mt)})", "invalid_value", name)
    if len(tokens) >= context:
        raise HTTPError(413, f"prompt of {len(tokens)} tokens does not fit the context of {context} tokens",
                        "prompt_too_long", "messages" if chat else "prompt")
    if len(tokens) + mt > context:
        raise HTTPError(422, f"prompt of {len(tokens)} tokens + {name} {mt} exceeds the context of "
                             f"{context} tokens; lower {name} to {context - len(tokens)} or less",
                        "context_length_exceeded", name)
    stream = bool(r.stream)
    include_usage = False
    if r.stream_options is not None:
        if not stream:
            raise HTTPError(422, "stream_options: only allowed with stream: true", "invalid_value", "stream_options")
        include_usage = bool(r.stream_options.include_usage)
    _greedy_only(r)
    return Parsed(prompt=tokens, max_tokens=mt, stream=stream, include_usage=include_usage, chat=chat)
