"""Train the embedded target and drafter on the Python standard library's sources.

Every machine with Python has this corpus, so the weights are reproducible offline:
    python scripts/train_reference_models.py            # ~13 minutes on 2 cores
    python scripts/train_reference_models.py --quick    # a smoke run, ~1 minute
    python scripts/train_reference_models.py --report-only   # the report of the shipped weights

Stages (seeded; fixed step counts, not time budgets, so a rerun gives the same data):
1. corpus: stdlib *.py (no site-packages, no test suites), files joined by EOS (byte 0);
   1 file in 20, chosen by a hash of its path, is held out and never trained on;
2. target: byte-level GPT, next-byte loss, bf16 autocast on CPU (2.3x faster than fp32);
3. drafter data: the target's own greedy continuations (K tokens after the root)
   from random contexts, with the hidden state the drafter is conditioned on;
4. drafter: per-position cross-entropy against those continuations;
5. held-out prompts (specaudit/data/prompts.jsonl) from the held-out files.
Writes specaudit/weights/{target,drafter}.safetensors (fp16) and training_report.json:
what was measured on the way (held-out bits per byte, the drafter's match rate by offset on
held-out samples, stage times) with the command, commit, date and machine. --report-only
trains nothing: it recomputes from the shipped weights what needs no training (the same
held-out samples, drawn with the same seeds) and lists under `not_reproduced` what only a
training run measures (the stage times), never a number typed in.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from specaudit.model import EOS_ID, GPT, BlockDrafter, DrafterConfig, GPTConfig, bits_per_byte, load_model, save_model  # noqa: E402  (after the sys.path / importorskip set-up above)

SKIP_DIRS = ("site-packages", "/test/", "/tests/", "/idlelib/", "/lib2to3/tests", "/__pycache__/")


def corpus_files() -> list[tuple[str, Path]]:
    std = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in sorted(glob.glob(str(std / "**" / "*.py"), recursive=True)):
        rel = os.path.relpath(f, std)
        if any(s in "/" + rel for s in SKIP_DIRS):
            continue
        out.append((rel, Path(f)))
    return out


def is_held_out(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 20 == 0


def load_bytes(files) -> np.ndarray:
    parts = []
    for _, p in files:
        b = p.read_bytes().replace(b"\x00", b"")
        parts.append(np.frombuffer(b, dtype=np.uint8))
        parts.append(np.array([EOS_ID], dtype=np.uint8))
    return np.concatenate(parts)


def batches(data: np.ndarray, bs: int, T: int, rng: np.random.Generator):
    ix = rng.integers(0, len(data) - T - 1, size=bs)
    x = np.stack([data[i:i + T] for i in ix]).astype(np.int64)
    y = np.stack([data[i + 1:i + T + 1] for i in ix]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def train_target(cfg, data, val, steps, bs, T, lr, rng, log):
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    t0 = time.time()
    for step in range(steps):
        cur = lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = cur
        x, y = batches(data, bs, T, rng)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model.forward_train(x)
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"target step {step}/{steps} loss {loss.item():.3f} "
                f"({bs * T * (step + 1) / (time.time() - t0):.0f} tok/s)")
    model.eval()
    return model, held_out_bpb(model, val, T)


@torch.no_grad()
def held_out_bpb(model, val, T) -> float:
    vrng = np.random.default_rng(1)
    losses = []
    for _ in range(8):
        x, y = batches(val, 16, T, vrng)
        logits, _ = model.forward_train(x)
        losses.append(F.cross_entropy(logits.view(-1, model.cfg.vocab_size), y.view(-1)).item())
    return bits_per_byte(float(np.mean(losses)))


@torch.no_grad()
def greedy_continuations(model: GPT, data, n, ctx, K, bs, rng, log):
    """Contexts from the corpus, then the target's own greedy tokens.

    Returns h_prev [n, D] (final hidden at the token whose argmax is the root), root
    [n] and labels [n, K] (the K greedy tokens after the root). A random number
    (0..16) of greedy tokens precede the root, as in decoding, where roots follow
    the model's own output rather than real text.
    """
    H, R, Y = [], [], []
    done = 0
    while done < n:
        b = min(bs, n - done)
        pre = int(rng.integers(0, 17))
        ix = rng.integers(0, len(data) - ctx - 1, size=b)
        x = torch.from_numpy(np.stack([data[i:i + ctx] for i in ix]).astype(np.int64))
        cache = model.new_cache(b, length=ctx + pre + K + 1)
        lens = torch.zeros(b, dtype=torch.long)
        pos = torch.arange(ctx)[None].expand(b, ctx)
        causal = torch.ones(ctx, ctx, dtype=torch.bool).tril()[None].expand(b, ctx, ctx)
        logits, h = model(x, pos, cache, lens, causal)
        lens = lens + ctx
        cur_h, tok = h[:, -1], logits[:, -1].argmax(-1)
        one = torch.ones(b, 1, 1, dtype=torch.bool)
        states = []  # (hidden at a consumed token, its argmax)
        for step in range(pre + K + 1):
            states.append((cur_h, tok))
            if step == pre + K:
                break
            logits, h = model(tok[:, None], lens[:, None].clone(), cache, lens, one)
            lens = lens + 1
            cur_h, tok = h[:, -1], logits[:, -1].argmax(-1)
        H.append(states[pre][0].clone())
        R.append(states[pre][1])
        Y.append(torch.stack([states[pre + 1 + k][1] for k in range(K)], 1))
        done += b
        if (done // b) % 16 == 0 or done >= n:
            log(f"drafter data {done}/{n}")
    return torch.cat(H), torch.cat(R), torch.cat(Y)


def train_drafter(dcfg, H, R, Y, steps, bs, lr, log):
    torch.manual_seed(0)
    model = BlockDrafter(dcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    n = H.shape[0]
    n_val = max(1, n // 20)
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        cur = lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for grp in opt.param_groups:
            grp["lr"] = cur
        ix = torch.randint(n_val, n, (bs,), generator=g)
        lp = model(H[ix], R[ix])  # [bs, K, V]
        loss = F.nll_loss(lp.reshape(-1, dcfg.vocab_size), Y[ix].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 250 == 0 or step == steps - 1:
            log(f"drafter step {step}/{steps} loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        pred = model(H[:n_val], R[:n_val]).argmax(-1)  # [n_val, K]
        match = (pred == Y[:n_val]).float()
        per_pos = match.mean(0).tolist()
        # expected chain commit: 1 + sum_k P(first k drafts all match)
        exp_commit = 1 + match.cumprod(1).sum(1).mean().item()
    return model, per_pos, exp_commit


def held_out_prompts(held, n=64, min_len=96, max_len=192, seed=0):
    """Prompts from held-out files: line-aligned windows of source code."""
    rng = np.random.default_rng(seed)
    out = []
    cands = [(rel, p.read_bytes().replace(b"\x00", b"")) for rel, p in held]
    cands = [(rel, b) for rel, b in cands if len(b) > 4 * max_len]
    while len(out) < n and cands:
        rel, b = cands[int(rng.integers(len(cands)))]
        i = int(rng.integers(0, len(b) - 2 * max_len))
        i = b.find(b"\n", i) + 1
        L = int(rng.integers(min_len, max_len + 1))
        chunk = b[i:i + L]
        j = chunk.rfind(b"\n")
        if j > min_len // 2:
            chunk = chunk[: j + 1]
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append({"source": rel, "prompt": text})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (weights not useful)")
    ap.add_argument("--target-steps", type=int, default=880)
    ap.add_argument("--drafter-samples", type=int, default=16384)
    ap.add_argument("--drafter-steps", type=int, default=3000)
    ap.add_argument("--target", metavar="SAFETENSORS",
                    help="skip stage 2 and build the drafter on this trained target")
    ap.add_argument("--out", default=str(ROOT / "specaudit" / "weights"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: write training_report.json from the weights in --out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.target_steps, args.drafter_samples, args.drafter_steps = 20, 256, 50
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)
    rng = np.random.default_rng(0)
    files = corpus_files()
    train_files = [f for f in files if not is_held_out(f[0])]
    held = [f for f in files if is_held_out(f[0])]
    data, val = load_bytes(train_files), load_bytes(held)
    log(f"corpus: {len(train_files)} train files ({len(data) / 1e6:.1f} MB), "
        f"{len(held)} held out ({len(val) / 1e6:.1f} MB)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report = report_of_shipped_weights(out, data, val, held, train_files, args, log)
        (out / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report))
        return
    t0 = time.time()
    if args.target:
        target = load_model(Path(args.target))
        cfg = target.cfg
        bpb = held_out_bpb(target, val, 512)
    else:
        cfg = GPTConfig()
        target, bpb = train_target(cfg, data, val, args.target_steps, 8, 512, 2e-3, rng, log)
        save_model(target, out / "target.safetensors", "gpt")  # saved early: later stages may fail
    t_target = time.time() - t0
    log(f"target: {bpb:.3f} bits/byte on held-out files in {t_target:.0f}s")
    t0 = time.time()
    dcfg = DrafterConfig(d_target=cfg.d_model)
    H, R, Y = greedy_continuations(target, data, args.drafter_samples, 128, dcfg.depth, 256, rng, log)
    t_data = time.time() - t0
    t0 = time.time()
    drafter, per_pos, exp_commit = train_drafter(dcfg, H, R, Y, args.drafter_steps, 256, 2e-3, log)
    t_drafter = time.time() - t0
    log("drafter match rate by offset: " + " ".join(f"{p:.2f}" for p in per_pos)
        + f"; expected chain commit (K={dcfg.depth}) {exp_commit:.2f}")
    save_model(drafter, out / "drafter.safetensors", "drafter")
    prompts = held_out_prompts(held)
    pdir = ROOT / "specaudit" / "data"
    pdir.mkdir(exist_ok=True)
    with open(pdir / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    seconds = {"target": None if args.target else round(t_target), "drafter_data": round(t_data),
               "drafter": round(t_drafter)}
    report = _report(out, args, bpb, per_pos, exp_commit, seconds, train_files, held, mode="trained",
                     prompts_written=True)
    if args.target:
        report["not_reproduced"] = {"seconds.target": "stage 2 was skipped (--target): the target was trained "
                                                      "by an earlier run"}
    (out / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _report(out: Path, args, bpb, per_pos, exp_commit, seconds, train_files, held, *, mode: str,
            prompts_written: bool) -> dict:
    """training_report.json: every figure computed by this run, with what produced it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchutil import provenance
    prompts = [json.loads(line) for line in (ROOT / "specaudit" / "data" / "prompts.jsonl").read_text().splitlines()]
    lens = [len(p["prompt"].encode()) for p in prompts]
    return {
        "written_by": provenance(), "mode": mode,
        "corpus": {"python_stdlib": sys.version.split()[0], "train_files": len(train_files),
                   "held_out_files": len(held), "held_out_rule": "sha1(path) % 20 == 0"},
        "target": {"file": "target.safetensors", "sha256": _sha256(out / "target.safetensors"),
                   "recipe": f"seed 0; {args.target_steps} steps of 8 x 512 bytes, bf16 autocast, "
                             "AdamW 2e-3 cosine",
                   "held_out_bits_per_byte": round(bpb, 4)},
        "drafter": {"file": "drafter.safetensors", "sha256": _sha256(out / "drafter.safetensors"),
                    "recipe": f"seed 0; {args.drafter_samples} greedy continuations of the target (context 128, "
                              f"K=8), then AdamW 2e-3 cosine over {args.drafter_steps} steps of 256; the first "
                              "1 in 20 samples held out",
                    "match_by_offset_held_out_samples": [round(p, 4) for p in per_pos],
                    "expected_chain_commit": round(exp_commit, 3)},
        "seconds": seconds,
        "prompts": {"file": "specaudit/data/prompts.jsonl", "count": len(prompts),
                    "min_bytes": min(lens), "max_bytes": max(lens),
                    "from_held_out_files": len({p["source"] for p in prompts}),
                    "written_by_this_run": prompts_written},
        "torch": torch.__version__,
    }


@torch.no_grad()
def report_of_shipped_weights(out: Path, data, val, held, train_files, args, log) -> dict:
    """The report of the weights in `out`, trained by an earlier run: held-out bits per byte
    of the target, and the drafter's match rate on the very samples its training held out
    (the first 1 in 20 of the drafter data, drawn again with the same seed: stage 3 with
    --target consumes the generator from its seed). Stage times need a training run."""
    target = load_model(out / "target.safetensors")
    drafter = load_model(out / "drafter.safetensors")
    bpb = held_out_bpb(target, val, 512)
    log(f"target: {bpb:.3f} bits/byte on held-out files")
    n_val = max(1, args.drafter_samples // 20)
    rng = np.random.default_rng(0)
    whole = -(-n_val // 256) * 256          # whole batches of 256, as the training run drew them
    H, R, Y = (x[:n_val] for x in greedy_continuations(target, data, whole, 128, drafter.cfg.depth, 256, rng, log))
    match = (drafter(H, R).argmax(-1) == Y).float()
    per_pos = match.mean(0).tolist()
    exp_commit = 1 + match.cumprod(1).sum(1).mean().item()
    log("drafter match rate by offset: " + " ".join(f"{p:.2f}" for p in per_pos))
    rep = _report(out, args, bpb, per_pos, exp_commit, {"target": None, "drafter_data": None, "drafter": None},
                  train_files, held, mode="report-only: the shipped weights, recomputed without training",
                  prompts_written=False)
    rep["prompts"]["same_as_regenerated"] = held_out_prompts(held) == [
        json.loads(line) for line in (ROOT / "specaudit" / "data" / "prompts.jsonl").read_text().splitlines()]
    why = "only a training run measures it (python3 scripts/train_reference_models.py without --report-only)"
    rep["not_reproduced"] = {"seconds.target": why, "seconds.drafter_data": why, "seconds.drafter": why}
    return rep

if __name__ == "__main__":
    main()
