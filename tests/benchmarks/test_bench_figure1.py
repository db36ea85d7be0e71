"""benchmarks/bench_figure1.py: the rows' hours and ratios from the measured rates, and resuming
(a variant whose recipes all have rows is not measured again; a stopped run keeps the variants
it finished). Measuring is replaced by a stand-in with fixed rates, so nothing here times
anything."""

import json

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
    # The committed B0 rows, as a run that measured B0 only left them.
    committed = common.RESULTS_DIR / "figure1_tensorflow.jsonl"
    before = [json.loads(line) for line in committed.read_text().splitlines()]
    before = [row for row in before if row["size"] == "b0"]
    assert len(before) == 5
    (tmp_path / "figure1_tensorflow.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in before))

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


def test_the_readme_table_and_report_only_read_the_rows_measuring_nothing(tmp_path, stand_in,
                                                                          capsys):
    bench_figure1.main(["--variants", "b1", "--rounds", "1", "--steps", "1",
                        "--output-dir", str(tmp_path)])
    stand_in.clear()
    capsys.readouterr()
    rows = bench_figure1.main(["--report-only", "--output-dir", str(tmp_path)])
    assert stand_in == []  # nothing measured
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines if line.startswith("| B1")]
    # In SERIES order; G16-LN+PN half: 10 img/s = 5.00x the reference's 2, one round (0%
    # spread), fine-tune 16 img/s, (350 x 1,281,167 / 10 + 2 x 1,281,167 / 16) / 3600 h.
    assert [line.split(" | ")[0] for line in table] == [
        "| B1 G1-GN native", "| B1 G16-GN native", "| B1 G16-GN half", "| B1 G16-LN+PN native",
        "| B1 G16-LN+PN half"]
    hours = round((350 * 1_281_167 / 10.0 + 2 * 1_281_167 / 16.0) / 3600)
    half = table[-1].split(" | ")
    assert half[1:6] == [str(rows[-1]["resolution"]), "10.0 (5.00x)", "0%", "16.0",
                         f"{hours:,}"]
    assert table[0].split(" | ")[2] == "2.0 (1.00x)"  # the reference itself


def test_report_only_without_rows_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="--report-only: no rows in .*figure1_"):
        bench_figure1.main(["--report-only", "--output-dir", str(tmp_path)])


def test_each_recipe_is_measured_in_a_process_of_its_own():
    import os

    # Memory a measured model leaves in TensorFlow cannot add up across recipes.
    assert bench_figure1.in_own_process("B9 x", os.getpid) != os.getpid()
    # A measuring process that dies (the kernel's OOM killer) is one line naming the recipe.
    with pytest.raises(SystemExit, match="the process measuring B9 x died"):
        bench_figure1.in_own_process("B9 x", os._exit, 9)


def test_the_front_keeps_the_rows_no_other_beats_on_hours_and_top1():
    rows = [{"variant": name, "hours_here": hours, "paper_top1": top1}
            for name, hours, top1 in [("a", 10.0, 79.0), ("b", 6.0, 80.0), ("c", 4.0, 78.0),
                                      ("d", 12.0, 82.0), ("e", 6.0, 79.5), ("f", 20.0, 82.0)]]
    # a: b is cheaper and better; e: b is as cheap and better; f: d reaches as much in fewer
    # hours; c, b, d: nothing reaches their top-1 in their hours or fewer.
    assert [row["variant"] for row in bench_figure1.front(rows)] == ["c", "b", "d"]
    # A row equal to another beats neither.
    assert len(bench_figure1.front(rows + [dict(rows[1], variant="b'")])) == 4
