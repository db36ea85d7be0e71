"""The native40, claim (a), table96 and Figure 1 tables of README.md and docs/results.md against
the rows they are read from (benchmarks/results/fashion_protocol.jsonl,
fashion_microbatch_long.jsonl, figure1_tensorflow.jsonl): a row that lands, or a figure edited by
hand, without the other fails here. Mean over the seeds, 95% Student-t half-width from SciPy
where a cell has one, rounded as the tables print them; the quiet columns from the speed pass's
best round (fashion_protocol_speed.jsonl)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from scipy import stats

from benchmarks import bench_fashion_protocol as protocol

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "benchmarks" / "results" / "fashion_protocol.jsonl"
MICROBATCH_ROWS = REPO / "benchmarks" / "results" / "fashion_microbatch_long.jsonl"
SPEED_ROWS = REPO / "benchmarks" / "results" / "fashion_protocol_speed.jsonl"
# A table row's first word -> the native40 recipe it reports.
RECIPES = {"G1-BN": "g1-bn-native", "G1-GN": "g1-gn-native", "G16-GN": "g16-gn-native",
           "G16-LN+PN": "g16-lnpn-native"}
# Column header -> (the row's field, digits printed).
COLUMNS = {"test top-1": ("top1", 4), "with flip": ("flip_top1", 4),
           "final validation top-1": ("val_top1", 4), "training s (loaded)": ("train_seconds", 0),
           "images/s (loaded)": ("images_per_second", 0)}
# Columns at the speed pass's rates: its best round's images/s, and the images a run trained on
# over that rate.
QUIET_COLUMNS = ("images/s (quiet)", "training s (quiet rate)")
NUMBER = r"(\d+(?:\.\d+)?)"


def speed_rows() -> dict[str, list[dict]]:
    by_recipe: dict[str, list[dict]] = {}
    for line in SPEED_ROWS.read_text().splitlines():
        row = json.loads(line)
        if (not row.get("quick") and not row.get("smoke")
                and protocol.current(row)):  # rows of the recipes as they are now
            by_recipe.setdefault(row["recipe"], []).append(row)
    return by_recipe


def experiment_rows(experiment: str, key: str = "recipe") -> dict[str, list[dict]]:
    """The full runs of one experiment's current recipes (no quick or smoke pass, as the report
    reads them), grouped by `key` (the recipe, or the variant label the tables name)."""
    groups: dict[str, list[dict]] = {}
    for row in protocol.current_rows(ROWS, experiment):
        groups.setdefault(row[key], []).append(row)
    return groups


def generate_module():
    """flags/generate.py, which writes the recipes' headers (it is a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate", REPO / "flags" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    return generate


def native40_rows() -> dict[str, list[dict]]:
    return experiment_rows("native40")


def native40_table(path: Path, opening: str = "| native 40 px") -> tuple[list[str],
                                                                         list[list[str]]]:
    """The header and rows of the first table whose header starts with `opening`."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(opening))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append([cell.strip() for cell in line.strip("|").split("|")])
    return header, body


def expected(values: list[float], digits: int) -> tuple[float, float | None]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return round(mean, digits), None
    sem = stats.sem(values)
    return round(mean, digits), round(stats.t.ppf(0.975, len(values) - 1) * sem, digits)


@pytest.mark.parametrize("document", ["README.md", "docs/results.md"])
def test_the_native40_table_holds_the_rows_figures(document):
    header, body = native40_table(REPO / document)
    rows = native40_rows()
    assert {cells[0].split()[0] for cells in body} == set(RECIPES)
    assert "seeds" in header and "test top-1" in header
    assert set(QUIET_COLUMNS) <= set(header)
    for cells in body:
        own = rows[RECIPES[cells[0].split()[0]]]
        assert int(cells[header.index("seeds")]) == len(own), cells[0]
        for column, cell in zip(header, cells):
            if column in QUIET_COLUMNS:
                best = max(r["images_per_second"] for r in speed_rows()[own[0]["recipe"]])
                if column == "images/s (quiet)":
                    assert float(cell) == pytest.approx(round(best), abs=0.5), cells[0]
                else:  # each run's images at that rate, with an interval from 2 seeds
                    check_cell(cell, [r["train_images"] / best for r in own], 0,
                               (cells[0], column))
                continue
            if column not in COLUMNS:
                continue
            field, digits = COLUMNS[column]
            mean, half_width = expected([float(r[field]) for r in own], digits)
            numbers = [float(n) for n in re.findall(NUMBER, cell)]
            assert numbers[0] == pytest.approx(mean, abs=0.5 * 10 ** -digits), (cells[0], column)
            if half_width is None:
                assert len(numbers) == 1, (cells[0], column, "one seed has no interval")
            else:
                assert numbers[1] == pytest.approx(half_width, abs=0.5 * 10 ** -digits)


def first_at(curve: list[dict], level: float) -> dict | None:
    """The first epoch of `curve` whose validation top-1 reaches `level` (None when none does)."""
    return next((p for p in curve if p["val_top1"] >= level), None)


def quiet_seconds_to(rows: list[dict], level: float, rate: float) -> list[float]:
    """Per run whose curve reaches `level`: the images it had seen by that epoch over `rate`
    (images/s), the seconds that epoch ends at the speed pass's quiet rate."""
    points = [(r, first_at(r["curve"], level)) for r in rows]
    return [p["epoch"] * r["train_images"] / r["epochs"] / rate for r, p in points if p]


def test_the_claim_b_reading_is_the_reference_curve():
    # G1-BN's final validation top-1 (the mean over its seeds, as bench_fashion_protocol's
    # report takes it) and the training seconds its curves first reach it, as docs/results.md
    # and README.md state them.
    reference = native40_rows()["g1-bn-native"]
    target = sum(r["curve"][-1]["val_top1"] for r in reference) / len(reference)
    reach = [p["train_seconds"] for p in (first_at(r["curve"], target) for r in reference) if p]
    # The same epochs at the speed pass's best quiet rate: the images seen by then over it.
    rate = max(r["images_per_second"] for r in speed_rows()["g1-bn-native"])
    quiet = quiet_seconds_to(reference, target, rate)
    for document in ("README.md", "docs/results.md"):
        text = " ".join((REPO / document).read_text().split())
        assert f"{target:.4f}" in text, document
        assert f"after {sum(reach) / len(reach):.0f} training seconds" in text, document
        assert f"{sum(quiet) / len(quiet):.0f} s at its quiet rate" in text, document


def check_cell(cell: str, values: list[float], digits: int, where) -> None:
    """`cell` prints mean (and, from 2 values, the 95% t half-width) of `values`; '-' for none."""
    if not values:
        assert cell == "-", where
        return
    mean, half_width = expected(values, digits)
    numbers = [float(n) for n in re.findall(r"[-+]?\d+(?:\.\d+)?", cell)]
    assert numbers[0] == pytest.approx(mean, abs=0.5 * 10 ** -digits), where
    if half_width is None:
        assert len(numbers) == 1, (where, "one seed has no interval")
    else:
        assert numbers[1] == pytest.approx(half_width, abs=0.5 * 10 ** -digits), where


@pytest.mark.parametrize("document", ["README.md", "docs/results.md"])
def test_the_claim_a_table_holds_the_long_schedules_rows(document):
    # Test top-1 per norm at micro-batch 32 and 2, and their difference over the seeds both
    # have (paired, as bench_fashion's report takes it).
    rows: dict = {}
    for line in MICROBATCH_ROWS.read_text().splitlines():
        row = json.loads(line)
        if row.get("schedule_name") == "long" and not row.get("quick"):
            rows.setdefault((row["variant"], row["micro_batch"]), {})[row["seed"]] = row["top1"]
    header, body = native40_table(REPO / document, "| claim (a)")
    assert {cells[0] for cells in body} == {"BN", "GN", "LN", "LN+PN"}
    for cells in body:
        small, large = rows.get((cells[0], 2), {}), rows.get((cells[0], 32), {})
        both = sorted(set(small) & set(large))
        assert cells[header.index("seeds")] == f"{len(large)} / {len(small)}", cells[0]
        check_cell(cells[header.index("micro-batch 32")], list(large.values()), 4, cells)
        check_cell(cells[header.index("micro-batch 2")], list(small.values()), 4, cells)
        check_cell(cells[header.index("micro-batch 2 - 32")],
                   [small[seed] - large[seed] for seed in both], 4, cells)


def test_the_table96_speed_table_holds_the_speed_pass_best_rounds():
    header, body = native40_table(REPO / "docs/results.md", "| table96 recipe")
    rates = speed_rows()
    labels = {rows[0]["variant"]: recipe for recipe, rows in rates.items()
              if rows[0]["experiment"] == "table96"}
    assert {cells[0] for cells in body} == set(labels)
    reference = max(r["images_per_second"] for r in rates["96-g1-bn-native"])
    for cells in body:
        own = rates[labels[cells[0]]]
        train = max(r["images_per_second"] for r in own)
        tunes = [r["finetune_images_per_second"] for r in own
                 if r.get("finetune_images_per_second")]
        assert int(cells[header.index("trains at px")]) == own[0]["train_resolution"]
        assert float(cells[header.index("training images/s (quiet)")]) == pytest.approx(
            round(train), abs=0.5), cells[0]
        tune = cells[header.index("fine-tune images/s (quiet)")]
        assert (tune == "-") if not tunes else float(tune) == pytest.approx(round(max(tunes)),
                                                                             abs=0.5), cells[0]
        assert float(cells[-1]) == pytest.approx(round(train / reference, 2), abs=0.005)


def test_the_recipes_cost_lines_hold_the_speed_pass_best_rounds():
    # flags/generate.py writes each Fashion-MNIST recipe's quiet rates into its header.
    generate = generate_module()
    rates = speed_rows()
    assert set(generate.FASHION_RATES) == set(rates)
    for recipe, (train, tune) in generate.FASHION_RATES.items():
        assert train == round(max(r["images_per_second"] for r in rates[recipe])), recipe
        tunes = [r["finetune_images_per_second"] for r in rates[recipe]
                 if r.get("finetune_images_per_second")]
        assert tune == (round(max(tunes)) if tunes else None), recipe
        header = (REPO / "flags" / f"fashion-mnist-{recipe}.flags").read_text()
        assert f"{train} training img/s, {55000 // 64 * 64 / train:.0f} s an epoch" in " ".join(
            line.lstrip("# ") for line in header.splitlines()), recipe


@pytest.mark.parametrize("document", ["README.md", "docs/results.md"])
def test_the_table96_table_holds_the_rows_figures(document):
    # One line per table96 recipe with rows, named by the rows' variant label; the quiet
    # seconds count the head fine-tune's images at its own quiet rate where there is one.
    rows = experiment_rows("table96", key="variant")
    header, body = native40_table(REPO / document, "| test 96 px")
    assert {cells[0] for cells in body} == set(rows)
    rates = speed_rows()
    for cells in body:
        own = rows[cells[0]]
        assert int(cells[header.index("seeds")]) == len(own), cells[0]
        for column, field in (("test top-1", "top1"), ("with flip", "flip_top1"),
                              ("final validation top-1", "val_top1")):
            check_cell(cells[header.index(column)], [r[field] for r in own], 4, cells)
        speed = rates[own[0]["recipe"]]
        train = max(r["images_per_second"] for r in speed)
        tunes = [r["finetune_images_per_second"] for r in speed
                 if r.get("finetune_images_per_second")]
        seconds = [r["train_images"] / train
                   + (r["finetune_images"] / max(tunes) if r.get("finetune_images") else 0.0)
                   for r in own]
        assert float(cells[header.index("images/s (quiet)")]) == pytest.approx(round(train),
                                                                                abs=0.5)
        check_cell(cells[header.index("training s (quiet rate)")], seconds, 0, cells)


@pytest.mark.parametrize("document", ["README.md", "docs/results.md"])
def test_the_reduced_recipes_accuracy_is_where_the_reference_curve_passes_it(document):
    # Claim (b) read the other way, as the documents state it: each reduced recipe's final
    # validation top-1 (after its head fine-tune; the mean over its seeds), and the quiet
    # seconds G1-BN's curves first reach it: the epoch's images over G1-BN's best quiet rate,
    # averaged over the G1-BN seeds that reach it.
    rows = experiment_rows("table96")
    rate = max(r["images_per_second"] for r in speed_rows()["96-g1-bn-native"])
    text = " ".join((REPO / document).read_text().split())
    for recipe in ("96-g16-lnpn-reduced", "96-g16-gn-reduced"):
        level = sum(r["val_top1"] for r in rows[recipe]) / len(rows[recipe])
        seconds = quiet_seconds_to(rows["96-g1-bn-native"], level, rate)
        assert seconds, recipe
        assert f"{level:.4f}" in text, (document, recipe)
        assert f"after {sum(seconds) / len(seconds):.0f} s" in text, (document, recipe)


@pytest.mark.parametrize("document", ["benchmarks/README.md", "docs/results.md"])
def test_the_figure1_table_is_the_committed_rows_printout(document):
    # The table bench_figure1 prints from benchmarks/results/figure1_tensorflow.jsonl, verbatim:
    # re-measured rows without the documents (or a figure edited by hand) fail here.
    from benchmarks import bench_figure1

    path = REPO / "benchmarks" / "results" / "figure1_tensorflow.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {row["size"] for row in rows} == set(bench_figure1.VARIANTS)
    assert bench_figure1.readme_table(rows) in (REPO / document).read_text()


@pytest.mark.parametrize("experiment", ["native40", "table96"])
def test_the_per_run_tables_are_the_rows_printout(experiment):
    # bench_fashion_protocol's table of every run (`--report-only` prints it), verbatim: a row
    # landed without the document, or a figure edited by hand, fails here.
    rows = protocol.current_rows(ROWS, experiment)
    assert protocol.seeds_table(rows, experiment) in (REPO / "docs/results.md").read_text()


def test_the_recipes_headers_hold_their_rows_figures():
    # flags/generate.py writes each Fashion-MNIST recipe's measured figures into its header:
    # seeds and the mean with its 95% t half-width of test top-1, with flips and final
    # validation top-1, as the rows give them now.
    generate = generate_module()
    measured = {}
    for experiment in ("native40", "table96"):
        for recipe, rows in experiment_rows(experiment).items():
            measured[recipe] = (len(rows),) + tuple(
                expected([r[field] for r in rows], 4)
                for field in ("top1", "flip_top1", "val_top1"))
    assert generate.FASHION_SEEDS == measured
