"""Hugging Face models in the runtime, and transformers' own assisted generation traced.

No downloads: tiny Llama-, Qwen2- and GPT-2-style models are built from configs with
seeded random weights and saved as safetensors with a byte-level tokenizer made here
(token id = byte value, EOS 256).
"""
from __future__ import annotations

import json

import pytest
from ci import import_or_fail

transformers = import_or_fail("transformers")
torch = import_or_fail("torch")

from specaudit.audit.check import check_paths  # noqa: E402  (after the sys.path / importorskip set-up above)
from specaudit.cli import main as cli_main  # noqa: E402  (after the sys.path / importorskip set-up above)
from specaudit.trace.safe_io import InputError  # noqa: E402  (after the sys.path / importorskip set-up above)
from specaudit.traced_run import run_traced  # noqa: E402  (after the sys.path / importorskip set-up above)

EOS = 256
PROMPTS = ["def foo(x):\n    return", "import os\n", "hello world", "for i in range(3):"]


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # GPT-2's byte-to-unicode table: each byte a printable character, so BPE with no
    # merges is exactly one token per byte
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    vocab["<eos>"] = EOS
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")


def tiny_config(arch: str, layers: int = 2, width: int = 64):
    common = dict(vocab_size=260, eos_token_id=EOS, bos_token_id=None, pad_token_id=None)
    if arch == "llama":
        return transformers.LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        **common)
    if arch == "qwen2":
        return transformers.Qwen2Config(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        **common)
    return transformers.GPT2Config(n_embd=width, n_layer=layers, n_head=4, n_positions=256, **common)


def save_tiny(path, arch: str, seed: int, layers: int = 2):
    torch.manual_seed(seed)
    cfg = tiny_config(arch, layers)
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
           "gpt2": transformers.GPT2LMHeadModel}[arch]
    model = cls(cfg)
    model.save_pretrained(path, safe_serialization=True)
    byte_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for arch in ("llama", "qwen2", "gpt2"):
        out[arch] = save_tiny(root / arch, arch, seed=1, layers=3)
        out[arch + "-small"] = save_tiny(root / (arch + "-small"), arch, seed=2, layers=1)
    return out


def plain_greedy(path, prompt: str, n: int) -> list[int]:
    m = transformers.AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([list(prompt.encode())])
    g = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                   pad_token_id=EOS)
    return g[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("algo,budget,topk,conc,drafter", [
    ("chain", 4, 1, 1, "skip:1"),
    ("tree", 6, 2, 2, "skip:2"),
    ("chain", 3, 1, 2, "small"),
])
def test_hf_target_is_lossless_and_checks_clean(tiny, tmp_path, arch, algo, budget, topk, conc, drafter):
    """Speculative output == plain greedy of the same model (the oracle and model.generate)."""
    spec = f"hf:{tiny[arch + '-small']}" if drafter == "small" else drafter
    r = run_traced(target_spec=f"hf:{tiny[arch]}", drafter_spec=spec, algo=algo, budget=budget, topk=topk,
                   concurrency=conc, prompts=PROMPTS[:3], num_prompts=3, max_new_tokens=20, oracle=True,
                   out=tmp_path / "t")
    assert r.summary["lossless"] is True, r.summary
    assert r.outputs[0][1:] == plain_greedy(tiny[arch], PROMPTS[0], 20)[1:20], "differs from model.generate"
    assert r.outputs[0][0] == plain_greedy(tiny[arch], PROMPTS[0], 1)[0]
    res = check_paths([tmp_path / "t"])
    assert res.exit_code == 0, [f.message for f in res.findings][:5]
    man = json.loads(next((tmp_path / "t").glob("run_id=*/run.json")).read_text())
    assert man["models"]["target"]["name"] == f"hf:{tiny[arch]}" and len(man["models"]["target"]["sha256"]) == 64


def test_hf_run_from_the_command_line(tiny, tmp_path, capsys):
    code = cli_main(["run", "--target", f"hf:{tiny['llama']}", "--drafter", "skip:1", "--num-prompts", "2",
                     "--max-new-tokens", "12", "--oracle", "--out", str(tmp_path / "t")])
    out = capsys.readouterr().out
    assert code == 0 and "lossless: yes" in out, out


def test_injected_fault_on_hf_target_is_caught(tiny, tmp_path):
    run_traced(target_spec=f"hf:{tiny['qwen2']}", drafter_spec="skip:2", algo="chain", budget=4,
               prompts=PROMPTS[:2], num_prompts=2, max_new_tokens=16, inject="commit-counter", out=tmp_path / "t")
    res = check_paths([tmp_path / "t"])
    assert res.exit_code == 1 and "SA301" in res.counts, res.counts


@pytest.mark.parametrize("case,needle", [
    ("not-a-dir", "is not a model folder"),
    ("no-config", "no config.json"),
    ("pickle-only", "pickle weights"),
    ("remote-code", "--trust-remote-code"),
    ("no-drafter", "needs --drafter"),
    ("bad-skip", "skip:9"),
    ("mismatch", "tokenizer mismatch"),
])
def test_bad_models_are_one_line_and_exit_2(tiny, tmp_path, capsys, case, needle):
    target, drafter = f"hf:{tiny['llama']}", "skip:1"
    if case == "not-a-dir":
        (tmp_path / "f.txt").write_text("x")
        target = f"hf:{tmp_path / 'f.txt'}"
    elif case == "no-config":
        (tmp_path / "m").mkdir()
        target = f"hf:{tmp_path / 'm'}"
    elif case == "pickle-only":
        d = tmp_path / "p"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (d / "pytorch_model.bin").write_bytes(b"\x80\x04")
        target = f"hf:{d}"
    elif case == "remote-code":
        import shutil
        d = shutil.copytree(tiny["llama"], tmp_path / "rc")
        cfg = json.loads((d / "config.json").read_text())
        cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil"}
        (d / "config.json").write_text(json.dumps(cfg))
        target = f"hf:{d}"
    elif case == "no-drafter":
        drafter = None
    elif case == "bad-skip":
        drafter = "skip:9"
    elif case == "mismatch":
        import shutil
        d = shutil.copytree(tiny["gpt2-small"], tmp_path / "other")
        tok = transformers.AutoTokenizer.from_pretrained(d)
        tok.add_tokens(["<extra>"])
        tok.save_pretrained(d)
        drafter = f"hf:{d}"
    argv = ["run", "--target", target, "--num-prompts", "1", "--max-new-tokens", "8", "--out", str(tmp_path / "t")]
    if drafter:
        argv += ["--drafter", drafter]
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "t").exists(), "something was written"


def test_drafter_without_hf_target_is_refused():
    with pytest.raises(InputError, match="--drafter needs --target"):
        run_traced(drafter_spec="skip:1", num_prompts=1, max_new_tokens=4)


# ------------------------------------------------------------- assisted generation


def _assisted(tiny, tmp_path, arch: str, bug=None, n: int = 24, prompts=PROMPTS, assistant=None, sample=False):
    from specaudit.integrations.transformers import assisted_manifest, traced_generate
    from specaudit.trace.parquet import ParquetSink
    from specaudit.trace.tracer import Tracer

    target = transformers.AutoModelForCausalLM.from_pretrained(tiny[arch])
    small = transformers.AutoModelForCausalLM.from_pretrained(tiny[assistant or arch + "-small"])
    # a fixed draft of 4 (a random assistant's low confidence would stop it after one)
    small.generation_config.num_assistant_tokens = 4
    small.generation_config.num_assistant_tokens_schedule = "constant"
    small.generation_config.assistant_confidence_threshold = 0.0
    run_id = f"hf-assisted-{arch}-{bug or 'clean'}"
    sp = {"temperature": 1.0, "seed": 0} if sample else None
    tracer = Tracer([ParquetSink(tmp_path / "t", run_id)], assisted_manifest(run_id, target, small,
                                                                             max_new_tokens=n, sampling=sp), run_id)
    outs = []
    torch.manual_seed(0)
    for i, p in enumerate(prompts):
        ids = torch.tensor([list(p.encode())])
        g = traced_generate(target, ids, assistant_model=small, tracer=tracer, request_id=str(i), bug=bug,
                            max_new_tokens=n, attention_mask=torch.ones_like(ids), pad_token_id=EOS,
                            **({"do_sample": True} if sample else {}))
        outs.append(g[0, ids.shape[1]:].tolist())
    tracer.close()
    return outs


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_assisted_generation_traces_check_clean(tiny, tmp_path, arch):
    outs = _assisted(tiny, tmp_path, arch)
    assert outs[0] == plain_greedy(tiny[arch], PROMPTS[0], 24), "assisted generation is lossless under greedy"
    res = check_paths([tmp_path / "t"])
    assert res.exit_code == 0, [f.message for f in res.findings][:5]
    assert res.steps > len(PROMPTS)  # several verify steps per request were recorded
    import pyarrow.parquet as pq
    lens = [len(x) for f in (tmp_path / "t").glob("run_id=*/steps-*.parquet")
            for x in pq.read_table(f, columns=["node_tokens"]).column("node_tokens").to_pylist()]
    assert max(lens) == 5  # root + 4 candidates


def test_assisted_generation_accepting_everything_checks_clean(tiny, tmp_path):
    """The target as its own assistant: whole drafts accepted, the last step cut at the limit."""
    outs = _assisted(tiny, tmp_path, "gpt2", assistant="gpt2", n=23, prompts=PROMPTS[:2])
    assert outs[0] == plain_greedy(tiny["gpt2"], PROMPTS[0], 23)
    res = check_paths([tmp_path / "t"])
    assert res.exit_code == 0, [f.message for f in res.findings][:5]


@pytest.mark.parametrize("bug,code", [("commit-counter", "SA301"), ("depth-plus-one", "SA3")])
def test_counter_bug_in_the_wrapper_is_caught(tiny, tmp_path, bug, code):
    # the target as its own assistant: every draft is accepted, so the counters have room to lie
    _assisted(tiny, tmp_path, "llama", bug=bug, assistant="llama")
    res = check_paths([tmp_path / "t"])
    assert res.exit_code == 1 and any(c.startswith(code) for c in res.counts), res.counts


SAMPLED_PROMPTS = PROMPTS + ["class A:\n", "x = [1, 2"]


@pytest.fixture(scope="module")
def sampled_trace(tiny, tmp_path_factory):
    """Sampled assisted generation (temperature 1, generate's default top-k 50), seeded."""
    tmp = tmp_path_factory.mktemp("sampled")
    _assisted(tiny, tmp, "llama", sample=True, prompts=SAMPLED_PROMPTS)
    return tmp / "t"


def _step_files(ds):
    """(file, table) of every steps part of the dataset (the sink writes several)."""
    import pyarrow.parquet as pq
    return [(f, pq.read_table(f)) for f in sorted(ds.glob("run_id=*/steps-*.parquet"))]


def test_sampled_assisted_generation_traces_check_clean(sampled_trace):
    """Contract v2 with the uniforms unknown: everything that needs no u is checked, and passes."""
    res = check_paths([sampled_trace])
    assert res.exit_code == 0, [f.message for f in res.findings][:5]
    man = json.loads(next(sampled_trace.glob("run_id=*/run.json")).read_text())
    assert man["schema_version"] == 2 and man["config"]["sampling"]["unknown"] == ["accept_u", "sampled_token"]
    assert man["config"]["sampling"]["top_k"] == 50          # generate's default, recorded as in effect
    rows = [r for _, t in _step_files(sampled_trace) for r in t.to_pylist()]
    assert all(all(u != u for u in r["accept_u"]) for r in rows)           # every uniform NaN: unknown
    assert all(len(r["draft_prob"]) == len(r["node_tokens"]) for r in rows)
    acc = [len(r["accepted_path"]) - 1 for r in rows]
    assert sum(acc) > 0 and min(acc) == 0, "some drafts accepted, some rejected"
    # the run's acceptance count was compared with sum(min(1, p/q)) (SA804 needs no uniforms)
    tests = sum(a + (a < len(r["node_tokens"]) - 1 and r["sampled_token"] >= 0) for a, r in zip(acc, rows))
    assert tests >= 30


@pytest.mark.parametrize("bug,code", [("commit-counter", "SA301"), ("depth-plus-one", "SA302")])
def test_counter_bug_in_the_sampled_wrapper_is_caught(tiny, tmp_path, bug, code):
    _assisted(tiny, tmp_path, "llama", bug=bug, sample=True, prompts=PROMPTS[:2])
    res = check_paths([tmp_path / "t"])
    assert res.exit_code == 1 and code in res.counts, res.counts


def _tamper(src, dst, edit, manifest_edit=None):
    """A copy of the sampled trace with edit(rows) applied to its step rows."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    shutil.copytree(src, dst)
    parts = [(f, t, t.to_pylist()) for f, t in _step_files(dst)]
    edit([r for _, _, rows in parts for r in rows])     # the rows are edited in place
    for f, t, rows in parts:
        pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), f)
    if manifest_edit:
        mf = next(dst.glob("run_id=*/run.json"))
        m = json.loads(mf.read_text())
        manifest_edit(m)
        mf.write_text(json.dumps(m))
    return check_paths([dst])


def test_unknown_uniforms_must_be_declared(sampled_trace, tmp_path):
    """All-NaN uniforms without config.sampling.unknown are drafts accepted without a test."""
    res = _tamper(sampled_trace, tmp_path / "d", lambda rows: None,
                  lambda m: m["config"]["sampling"].pop("unknown"))
    assert res.exit_code == 1 and "SA801" in res.counts, res.counts
    assert any("without a test" in f.message for f in res.findings)


def test_decisions_no_uniform_allows_are_caught(sampled_trace, tmp_path):
    """SA801's bounds: an accepted draft with p = 0, a rejected one with p/q >= 1."""
    def edit(rows):
        acc = next(r for r in rows if len(r["accepted_path"]) >= 2)
        acc["target_prob"][acc["accepted_path"][1]] = 0.0
        rej = next(r for r in rows if len(r["accepted_path"]) == 1 and len(r["node_tokens"]) > 1)
        rej["target_prob"][1] = min(1.0, 2 * rej["draft_prob"][1])
    res = _tamper(sampled_trace, tmp_path / "d", edit)
    msgs = [f.message for f in res.findings if f.code == "SA801"]
    assert any("no uniform accepts it" in m for m in msgs) and any("every uniform accepts it" in m for m in msgs)


def test_a_sampler_that_accepts_too_often_is_caught_without_uniforms(sampled_trace, tmp_path):
    """p recorded at a fifth of its value on every draft: the accepted count is far above
    sum(min(1, p/q)) (SA804), though no single decision is impossible."""
    def edit(rows):
        for r in rows:
            r["target_prob"] = [r["target_prob"][0]] + [x / 5 for x in r["target_prob"][1:]]
    res = _tamper(sampled_trace, tmp_path / "d", edit)
    assert "SA804" in res.counts and "accepts too often" in str([f.message for f in res.findings])


def test_ensemble_weight_is_refused(tiny):
    from specaudit.integrations.transformers import traced_generate
    m = transformers.AutoModelForCausalLM.from_pretrained(tiny["llama"])
    with pytest.raises(InputError, match="lossy"):
        traced_generate(m, torch.tensor([[1, 2, 3]]), assistant_model=m, tracer=None, do_sample=True,
                        assistant_ensemble_weight=0.5)


def test_ab_arms_on_hf_checkpoints(tiny, tmp_path, capsys):
    """`specaudit ab` runtime mode with arms on a Hugging Face target: layer-skip vs a small drafter."""
    t = f"hf:{tiny['gpt2']}"
    code = cli_main(["ab", f"--a=--target {t} --drafter skip:1 --budget 3 --max-new-tokens 16",
                     f"--b=--target {t} --drafter hf:{tiny['gpt2-small']} --budget 3 --max-new-tokens 16",
                     "--vary", "drafter",
                     "--num-prompts", "2", "--repeats", "1", "--no-progress", "--out", str(tmp_path / "ab"),
                     "--output-format", "json"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    res = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert res["a"]["settings"]["drafter"] == "skip:1" and res["b"]["settings"]["drafter"].startswith("hf:")
    assert set(res["settings_differ"]) == {"drafter"} and res["outputs_identical"]
    for sub in ("a", "b"):
        assert check_paths([tmp_path / "ab" / sub]).exit_code == 0


def test_calibrate_on_an_hf_target(tiny, tmp_path, capsys):
    code = cli_main(["calibrate", "--target", f"hf:{tiny['llama']}", "--drafter", "skip:1", "--n-nodes", "2,4",
                     "--concurrency", "1", "--repeats", "1", "--max-new-tokens", "12",
                     "--out", str(tmp_path / "c.json"),
                     "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    prof = json.loads((tmp_path / "c.json").read_text())
    assert {e["n_nodes"] for e in prof["entries"]} == {2, 4} and all(e["r"] > 0 for e in prof["entries"])
