"""`specaudit serve --target hf:PATH --drafter hf:PATH|skip:N`: the OpenAI-compatible API
over a Hugging Face pair, its tokenizer serving the text endpoints.

No downloads: a tiny seeded Llama target (3 layers) and a 1-layer drafter saved with
test_hf's byte-level tokenizer (plus a chat template here). The answers must equal plain
greedy `model.generate` on the same token ids (lossless), and the trace must check clean.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from ci import import_or_fail

transformers = import_or_fail("transformers")
torch = import_or_fail("torch")
httpx = import_or_fail("httpx")

from test_hf import EOS, save_tiny  # noqa: E402  (after the importorskip set-up above)

from specaudit.audit.check import check_paths  # noqa: E402  (after the importorskip set-up above)
from specaudit.cli import main as cli_main  # noqa: E402  (after the importorskip set-up above)

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-serve")
    target = save_tiny(root / "llama", "llama", seed=1, layers=3)
    small = save_tiny(root / "llama-small", "llama", seed=2, layers=1)
    tok = transformers.AutoTokenizer.from_pretrained(target)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(target)
    return target, small


def plain_greedy(path, ids: list[int], n: int) -> list[int]:
    m = transformers.AutoModelForCausalLM.from_pretrained(path)
    x = torch.tensor([ids])
    g = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=EOS)
    return g[0, x.shape[1]:].tolist()


@pytest.mark.parametrize("drafter", ["small", "skip:1"])
def test_serve_hf_pair_is_lossless_and_checks_clean(pair, tmp_path, drafter):
    from specaudit.serve.server import SpecServer
    target, small = pair
    tok = transformers.AutoTokenizer.from_pretrained(target)
    spec = f"hf:{small}" if drafter == "small" else drafter
    srv = SpecServer(trace_dir=tmp_path / "t", target_spec=f"hf:{target}", drafter_spec=spec, port=0,
                     concurrency=2, budget=3, max_new_tokens=24, flush_s=0.2).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            models = c.get("/v1/models").json()["data"]
            assert models[0]["id"] == f"hf:{target}" and models[0]["max_model_len"] == 256
            prompt = "def foo(x):\n    return"
            ids = [EOS - 1, 104, 105]   # token ids beyond the byte range: the model's vocabulary now
            with ThreadPoolExecutor(2) as ex:   # both in the running batch at once (2 slots)
                fa = ex.submit(c.post, "/v1/completions", json={"prompt": prompt, "max_tokens": 20})
                fb = ex.submit(c.post, "/v1/completions", json={"prompt": ids, "max_tokens": 8})
                r, rb = fa.result().json(), fb.result().json()
            want = plain_greedy(target, tok(prompt)["input_ids"], 20)
            assert r["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True)
            assert r["usage"]["completion_tokens"] == len(want)
            assert r["usage"]["prompt_tokens"] == len(prompt.encode())
            assert rb["choices"][0]["text"] == tok.decode(plain_greedy(target, ids, 8), skip_special_tokens=True)
            bad = c.post("/v1/completions", json={"prompt": [300], "max_tokens": 8})
            assert bad.status_code == 422 and "0..259" in bad.json()["error"]["message"]
            # chat: the tokenizer's own template, streamed; the deltas join to the whole answer
            msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo"}]
            chat_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            chat_ids = tok(chat_ids, add_special_tokens=False)["input_ids"]
            want = tok.decode(plain_greedy(target, chat_ids, 24), skip_special_tokens=True)
            text = ""
            with c.stream("POST", "/v1/chat/completions",
                          json={"messages": msgs, "max_tokens": 24, "stream": True}) as s:
                for line in s.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        for ch in json.loads(line[6:])["choices"]:
                            text += ch["delta"].get("content") or ""
            assert text == want
            r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 24}).json()
            assert r["choices"][0]["message"]["content"] == want
    finally:
        srv.close()
    man = json.loads(next((tmp_path / "t").glob("run_id=*/run.json")).read_text())
    assert man["models"]["target"]["name"] == f"hf:{target}" and len(man["models"]["target"]["sha256"]) == 64
    assert man["models"]["drafter"]["name"] == spec and man["config"]["eos_id"] == EOS
    res = check_paths([tmp_path / "t"])
    assert res.exit_code == 0 and res.steps > 4, [f.message for f in res.findings][:5]


def test_hf_stream_decoder_waits_for_whole_characters(pair):
    from specaudit.serve.codec import HFCodec
    tok = transformers.AutoTokenizer.from_pretrained(pair[0])
    codec = HFCodec(tok)
    ids = list("aé€b".encode()) + [EOS]       # é and € span 2 and 3 byte tokens
    d = codec.stream_decoder()
    parts = [d.push([t]) for t in ids] + [d.flush()]
    assert "".join(parts) == "aé€b" == codec.decode(ids)
    assert "\ufffd" not in "".join(parts) and parts[2] == "é" and parts[1] == ""


@pytest.mark.parametrize("case,needle", [
    ("not-a-model", "no config.json"),
    ("no-drafter", "needs --drafter"),
    ("drafter-alone", "--drafter needs --target"),
    ("bad-skip", "skip:7"),
])
def test_serve_bad_models_are_one_line_and_exit_2(pair, tmp_path, capsys, case, needle):
    target, drafter = f"hf:{pair[0]}", "skip:1"
    if case == "not-a-model":
        (tmp_path / "empty").mkdir()
        target = f"hf:{tmp_path / 'empty'}"
    elif case == "no-drafter":
        drafter = None
    elif case == "drafter-alone":
        target = None
    elif case == "bad-skip":
        drafter = "skip:7"
    argv = ["serve", "--port", "0", "--trace-dir", str(tmp_path / "t")]
    argv += ["--target", target] if target else []
    argv += ["--drafter", drafter] if drafter else []
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "t").exists(), "something was written"
