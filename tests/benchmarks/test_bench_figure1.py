"""benchmarks/bench_figure1.py: the rows' hours and ratios from the measured rates, and resuming
(a variant whose recipes all have rows is not measured again; a stopped run keeps the variants
it finished). Measuring is replaced by a stand-in with fixed rates, so nothing here times
anything."""

import json
import shutil

import pytest

from benchmarks import bench_figure1, charts, common

pytestmark = pytest.mark.tf_only

# Training and fine-tune images/s of the stand-in, per (family, series).
RATES = {("g1-gn", "native"): (2.0, 8.0), ("g16-gn", "native"): (4.0, 12.0),
         ("g16-gn", "half"): (8.0, 12.0), ("g16-lnpn", "native"): (5.0, 14.0),
         ("g16-lnpn", "half"): (10.0, 16.0)}


@pytest.fixture
def stand_in(monkeypatch):
    calls = []

    def measure(variant, family, series, args):
        calls.append((variant, family, series))
        if variant == "b3":
            raise KeyboardInterrupt  # the run is stopped while it measures B3
        train_ips, finetune_ips = RATES[(family, series)]
        return {"config": bench_figure1.recipe(variant, family, series),
                "train_resolution": 100, "test_resolution": 120, "batch": 32,
                "train_ips": train_ips, "finetune_ips": finetune_ips}

    monkeypatch.setattr(bench_figure1, "measure", measure)
    return calls


def test_rows_resume_by_variant_and_keep_the_rows_already_there(tmp_path, stand_in):
    committed = common.RESULTS_DIR / "figure1_tensorflow.jsonl"
    shutil.copy(committed, tmp_path / "figure1_tensorflow.jsonl")
    before = [json.loads(line) for line in committed.read_text().splitlines()]
    assert {r["size"] for r in before} == {"b0"} and len(before) == 5

    args = ["--variants", "b0", "b1", "b2", "b3", "--rounds", "1", "--steps", "1",
            "--output-dir", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        bench_figure1.main(args)
    # B0 was there: not measured; B1 and B2 measured, their rows written; stopped in B3.
    assert [c[0] for c in stand_in] == ["b1"] * 5 + ["b2"] * 5 + ["b3"]
    rows = charts.read_rows(tmp_path / "figure1_tensorflow.jsonl")
    assert rows[:5] == before
    assert sorted({r["size"] for r in rows}) == ["b0", "b1", "b2"] and len(rows) == 15

    stand_in.clear()
    with pytest.raises(KeyboardInterrupt):
        bench_figure1.main(args)
    assert [c[0] for c in stand_in] == ["b3"]  # resumed at the variant it stopped in


def test_hours_and_ratios_come_from_the_measured_rates(tmp_path, stand_in):
    rows = bench_figure1.main(["--variants", "b1", "--rounds", "2", "--steps", "1",
                               "--output-dir", str(tmp_path)])
    assert len(stand_in) == 10  # two rounds of the five recipes
    by_series = {(r["family"], r["series"]): r for r in rows}
    half = by_series[("g16-lnpn", "half")]
    # flags/b1-g16-lnpn-half.flags: 350 epochs at 10 img/s, then 2 fine-tune epochs at 16.
    assert half["hours_here"] == pytest.approx(
        (350 * 1_281_167 / 10.0 + 2 * 1_281_167 / 16.0) / 3600, abs=0.05)
    assert half["ratio_to_reference"] == pytest.approx(10.0 / 2.0)
    assert half["reference"] == "B1 G1-GN native" and half["paper_top1"] > 0
    assert (half["warmup"], half["steps"], half["rounds"]) == (2, 1, 2)
    for row in rows:
        common.validate_row(row)
