"""specaudit report: a self-contained page whose every plot really renders in a browser.

The rendering test opens report.html in headless Chromium (Debian's `chromium`, which
scripts/test.sh installs) twice: once with a probe script appended to a copy, dumping the
DOM with each <img>'s naturalWidth and its box on the page, once as it is, taking a
screenshot. Each plot's box in the screenshot must then hold that plot's own pixels (the
PNG written beside the page), not a broken-image icon or a blank: that is what shows the
browser decoded and painted every image. A page with one corrupted image is the negative
control: the same check must catch it.
"""
from __future__ import annotations

import base64
import html.parser
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from ci import need

from specaudit.audit.findings import Finding
from specaudit.cli import main as cli_main
from specaudit.postmortem.report import PLOTS, PX_H, PX_W, build_report
from specaudit.postmortem.tables import config_label

STEMS = [p[0] for p in PLOTS]


@pytest.fixture(scope="module")
def synth_ds(tmp_path_factory):
    """A clean chain run and a tree run whose reported mean accepted depth lies (7.0)."""
    from specaudit.trace.synth import synth_run_rows, write_run
    out = tmp_path_factory.mktemp("rsynth")
    s, r, m = synth_run_rows(10, algo="chain", budget=7, seed=11, run_id="good-chain", max_new_tokens=40)
    write_run(out, s, r, m)
    s, r, m = synth_run_rows(10, algo="tree", budget=12, topk=3, seed=12, run_id="liar-tree", max_new_tokens=40)
    m["reported"]["mean_accepted_depth"] = 7.0
    write_run(out, s, r, m, n_files=2)
    return out


@pytest.fixture(scope="module")
def report(synth_ds, tmp_path_factory):
    from specaudit.audit.check import check_paths
    res = check_paths([str(synth_ds)])
    out = tmp_path_factory.mktemp("report")
    path = build_report([synth_ds], out, findings=res.findings, summary=res.summary())
    return path, res


class _Imgs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.tags, self.attrs_all, self.body = [], [], [], {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.attrs_all.append(a)
        if tag == "img":
            self.imgs.append(a)
        if tag == "body":
            self.body = a


def parse(text: str) -> _Imgs:
    p = _Imgs()
    p.feed(text)
    return p


# ---------------------------------------------------------------- the page itself

def test_report_is_self_contained(report):
    path, _ = report
    text = path.read_text()
    page = parse(text)
    assert [i["id"] for i in page.imgs] == STEMS
    for img in page.imgs:
        assert img["src"].startswith("data:image/png;base64,")
        png = base64.b64decode(img["src"].split(",", 1)[1])
        assert png == (path.parent / f"{img['id']}.png").read_bytes()
        assert (int(img["width"]), int(img["height"])) == (PX_W, PX_H)
    # nothing to fetch: no scripts, stylesheets, frames or remote URLs anywhere
    assert not {"script", "link", "iframe", "object", "embed"} & set(page.tags)
    for a in page.attrs_all:
        for k in ("src", "href"):
            assert not a.get(k, "data:").lower().startswith(("http:", "https:", "//", "file:")), a
    assert not re.search(r"url\(\s*['\"]?(https?:|//)", text) and "@import" not in text


def test_report_top_has_configs_reported_vs_rows_and_checker_summary(report, synth_ds):
    path, res = report
    text = path.read_text()
    assert "chain b7 k1 c4" in text and "tree b12 k3 c4" in text
    assert "good-chain" in text and "liar-tree" in text
    # the lying counter is shown next to the derived value, in red
    row = re.search(r"<tr><td>tree b12 k3 c4</td>.*?</tr>", text).group(0)
    assert re.search(r'class="n bad">[0-9.]+ / 7 ✗<', row), row    # derived / reported
    good = re.search(r"<tr><td>chain b7 k1 c4</td>.*?</tr>", text).group(0)
    assert 'class="n bad"' not in good
    assert res.errors > 0 and f"{res.errors:,} error finding(s)" in text
    for code in res.counts:
        assert f"<td>{code}</td>" in text


def test_pngs_are_real_plots(report):
    from PIL import Image
    path, _ = report
    arrays = {}
    for stem in STEMS:
        im = Image.open(path.parent / f"{stem}.png").convert("RGB")
        assert im.size == (PX_W, PX_H)
        a = np.asarray(im, dtype=np.float32)
        assert a.std() > 10, stem                       # not a blank canvas
        arrays[stem] = a
    for i, s1 in enumerate(STEMS):                       # six different pictures
        for s2 in STEMS[i + 1:]:
            assert np.abs(arrays[s1] - arrays[s2]).mean() > 3, (s1, s2)


def test_report_without_checker_says_so(synth_ds, tmp_path):
    path = build_report([synth_ds], tmp_path / "r")
    text = path.read_text()
    assert "The checker was not run" in text
    assert len(parse(text).imgs) == 6 and (tmp_path / "r" / "violations_by_code.png").exists()


def test_report_command(synth_ds, tmp_path, capsys):
    rc = cli_main(["report", str(synth_ds), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    # the liar-tree run breaks rules: the report is written and exits 1, as `specaudit check` would
    assert rc == 1 and out.startswith(f"report: {tmp_path / 'out' / 'report.html'}")
    assert "violation(s)" in out
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == sorted([f"{s}.png" for s in STEMS] + ["report.html"])
    # inputs untouched, nothing else written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_report_bad_input(synth_ds, tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for argv, msg in ((["report", str(tmp_path / "missing"), "--out", str(tmp_path / "o")], "no such file"),
                      (["report", str(synth_ds), "--out", str(f), "--no-check"], "not a folder"),
                      (["report", str(tmp_path), "--out", str(tmp_path / "o")], "no trace runs")):
        rc = cli_main(argv)
        _, err = capsys.readouterr()
        assert rc == 2 and len(err.strip().splitlines()) == 1 and msg in err, (argv, err)


def test_findings_passed_as_dicts(synth_ds, tmp_path):
    fs = [Finding("SA301", "commit-len-vs-depth", "error", "run x step 3: depth 7, commit 2").to_dict()]
    text = build_report([synth_ds], tmp_path / "r", findings=fs).read_text()
    assert "<td>SA301</td>" in text and "1 error finding(s)" in text


# ------------------------------------------------------------- headless Chromium

def chromium_bin():
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--hide-scrollbars", "--force-device-scale-factor=1", "--mute-audio"]
PROBE = """<script>
window.addEventListener('load', () => {
  for (const img of document.querySelectorAll('img')) {
    const r = img.getBoundingClientRect();
    img.setAttribute('data-nw', img.naturalWidth);
    img.setAttribute('data-nh', img.naturalHeight);
    // the content box (inside any border), in page coordinates
    img.setAttribute('data-box', [r.left + img.clientLeft + scrollX, r.top + img.clientTop + scrollY,
                                  img.clientWidth, img.clientHeight].map(Math.round).join(','));
  }
  document.body.setAttribute('data-height', document.documentElement.scrollHeight);
});
</script></body>"""
WIDTH = 1000


def _chrome(args, tmp: Path, timeout=90) -> subprocess.CompletedProcess:
    prof = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run([chromium_bin(), *CHROME_FLAGS, f"--user-data-dir={prof}", *args],
                          capture_output=True, text=True, timeout=timeout)


def rendered_plots(page: Path, tmp: Path) -> dict:
    """Open page in headless Chromium; per <img id>: natural size, box, and the screenshot
    pixels in that box (RGB float array)."""
    from PIL import Image
    probe = tmp / f"probe-{page.name}"
    probe.write_text(page.read_text().replace("</body>", PROBE))
    r = _chrome([f"--window-size={WIDTH},900", "--virtual-time-budget=10000", "--dump-dom",
                 probe.resolve().as_uri()], tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = parse(r.stdout)
    height = int(dom.body.get("data-height", 0))
    assert height > 0, "the probe did not run: no load event"
    shot = tmp / f"shot-{page.stem}.png"
    r = _chrome([f"--window-size={WIDTH},{height}", f"--screenshot={shot}", page.resolve().as_uri()], tmp)
    assert shot.exists(), r.stderr[-2000:]
    im = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float32)
    out = {}
    for img in dom.imgs:
        x, y, w, h = (int(v) for v in img["data-box"].split(","))
        out[img["id"]] = dict(nw=int(img["data-nw"]), nh=int(img["data-nh"]), box=(x, y, w, h),
                              pixels=im[y:y + h, x:x + w])
    return out


def matches(pixels: np.ndarray, png: Path) -> float:
    """Mean absolute difference (0..255) between a screenshot region and a PNG file."""
    from PIL import Image
    ref = np.asarray(Image.open(png).convert("RGB"), dtype=np.float32)
    if pixels.shape != ref.shape:
        return float("inf")
    return float(np.abs(pixels - ref).mean())


@need(chromium_bin() is not None, "chromium is not installed")
def test_every_plot_renders_in_headless_chromium(report, tmp_path):
    path, _ = report
    got = rendered_plots(path, tmp_path)
    assert list(got) == STEMS
    for stem, g in got.items():
        assert (g["nw"], g["nh"]) == (PX_W, PX_H), stem   # decoded
        x, y, w, h = g["box"]
        assert (w, h) == (g["nw"], g["nh"]) and y + h <= 100_000
        # the screenshot holds this plot's own pixels where the image sits ...
        assert matches(g["pixels"], path.parent / f"{stem}.png") < 2.0, stem
        # ... and not any other plot's (the comparison can tell them apart)
        others = [matches(g["pixels"], path.parent / f"{o}.png") for o in STEMS if o != stem]
        assert min(others) > 3.0, stem


@need(chromium_bin() is not None, "chromium is not installed")
def test_chromium_check_catches_a_broken_image(report, tmp_path):
    """Negative control: corrupt one data URI; the same check must see it fail."""
    path, _ = report
    bad = tmp_path / "broken" / "report.html"
    bad.parent.mkdir()
    for stem in STEMS:
        shutil.copy(path.parent / f"{stem}.png", bad.parent / f"{stem}.png")
    text = path.read_text()
    b64 = re.search(r'id="commit_length_histogram"[^>]*src="data:image/png;base64,([^"]+)"', text).group(1)
    bad.write_text(text.replace(b64, b64[:200] + "AAAA" * 50 + b64[-100:]))
    got = rendered_plots(bad, tmp_path)
    g = got["commit_length_histogram"]
    assert g["nw"] == 0 or matches(g["pixels"], bad.parent / "commit_length_histogram.png") > 2.0
    assert matches(got["latency_breakdown"]["pixels"], bad.parent / "latency_breakdown.png") < 2.0


# ------------------------------------------------------------- real traces

def test_report_on_real_runs(clean_dataset, tmp_path):
    """The embedded models' clean runs: checker clean, every reported counter matches its rows."""
    from specaudit.audit.check import check_paths
    ds, results = clean_dataset
    res = check_paths([str(ds)])
    path = build_report([ds], tmp_path / "r", findings=res.findings, summary=res.summary())
    text = path.read_text()
    assert ("clean: no rule broken" in text) == (res.errors == 0)
    assert 'class="n bad"' not in text          # every reported counter matches its rows
    for r in results:
        assert r.run_id in text and config_label(r.manifest["config"]) in text
    assert len(parse(text).imgs) == len(STEMS)
    assert json.dumps(res.summary())            # the summary is plain data
