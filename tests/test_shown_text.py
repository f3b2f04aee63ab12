"""Plain data never breaks a tool (issue 51): class names, keys and paths from a stranger reach the terminal as text
(rich markup escaped, controls and bidi overrides as escapes), a Parquet file with damaged pages is one line, and
the CSV cells the project writes are escaped against formula injection and read back exactly."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import struct
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from rich.table import Table

from project.active.loop import ActiveLoop, write_selection
from project.active.oracle import read_answers, write_request
from project.active.strategies import Selected
from project.data.shard_index import Shard, ShardIndex
from project.shown import csv_cell, csv_value, shown
from project.tasks.image.demo import make_demo

from .conftest import run_here, small_run

# one hostile name per class of the demo's ten: markup, escape codes (7-bit and C1), a bidi override, a bell, DEL,
# line breaks, and a last backslash (which rich's own escape would double)
HOSTILE = [
    "[/circle]",
    "ring\x1b[2J",
    "tri\u202eangle",
    "[bold red]square",
    "hex\x07agon",
    "star\x9b31m",
    "cross\x7f",
    "cres\rcent",
    "bar\nnew",
    "arrow\\",
]
# what must never reach a terminal from data: every control but the line feed and tab output is made of, and bidi
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def rendered(text: str) -> str:
    """What rich prints for `text` as a table cell (markup parsed, as Lightning's and inspect's tables do)."""
    console = Console(file=io.StringIO(), width=200, color_system=None)
    table = Table.grid()
    table.add_row(text)
    console.print(table)
    return console.file.getvalue().rstrip("\n").rstrip()


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_shown_escapes_controls_and_bidi_and_rich_renders_markup_as_text():
    for character in ["\x00", "\t", "\n", "\r", "\x1b", "\x7f", "\x85", "\x9b", "\u202a", "\u202e", "\u2066", "\u2069"]:
        assert RAW.search(shown(f"a{character}b")) is None and "\\" in shown(f"a{character}b"), repr(character)
    assert shown("ring\x1b[2J") == "ring\\x1b[2J" and shown("bar\nnew") == "bar\\nnew"
    assert shown("tri\u202eangle") == "tri\\u202eangle" and shown("star\x9b31m") == "star\\x9b31m"
    assert shown("Köln/猫 C:\\data") == "Köln/猫 C:\\data"  # printable text and backslashes stay as they are
    for name in [*HOSTILE, "a\\[b]", "\\", "[link=file:///etc/passwd]x[/link]", "[@click=quit]x"]:
        assert rendered(shown(name, markup=True)) == shown(name), repr(name)
    with pytest.raises(Exception, match="closing tag"):  # what the unescaped name did to every rich table
        rendered("[/circle]")


def hostile_demo(root: Path) -> Path:
    """A small demo dataset whose index names its classes HOSTILE, and a train shard with one broken image
    under a hostile key."""
    make_demo(root, train=64, val=32, test=32, image_size=16, samples_per_shard=32, workers=1, quiet=True)
    for split in ("train", "val", "test"):
        path = root / split / "shardindex.json"
        index = json.loads(path.read_text())
        index["classes"] = HOSTILE
        if split == "train":
            shard = root / split / "hostile.tar"
            with tarfile.open(shard, "w") as tar:
                for name, data in [("bad\x1b[2J\u202e.jpg", b"not an image"), ("bad\x1b[2J\u202e.cls", b"1")]:
                    member = tarfile.TarInfo(name)
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
            index["shardlist"].append({"url": shard.name, "nsamples": 1, "filesize": shard.stat().st_size})
        path.write_text(json.dumps(index))
    return root


def test_inspect_shows_hostile_class_names_and_keys_as_text(tmp_path):
    root = hostile_demo(tmp_path / "demo")
    result = run_here("project.shards.inspect", str(root), f"--sheet={tmp_path / 'sheet.png'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert RAW.search(output) is None, repr(RAW.search(output))
    for name in HOSTILE:
        assert shown(name) in result.stdout, name  # each class's row, markup shown as typed
    assert "[/circle]" in result.stdout and "[bold red]square" in result.stdout
    assert "the first: bad\\x1b[2J\\u202e:" in result.stdout  # the broken image's key, escaped
    assert (tmp_path / "sheet.png").is_file()


def test_train_and_evaluate_print_per_class_metrics_of_hostile_class_names_as_text(tmp_path, caplog):
    root = hostile_demo(tmp_path / "demo")
    # the broken image under a hostile key: skipped, and its warning shown
    flags = small_run(root, "--data.max_skipped_fraction=0.5")
    train = run_here(
        "project.train", *flags, "--trainer.max_epochs=1", "--trainer.logger.init_args.name=hostile", cwd=tmp_path
    )
    assert train.returncode == 0, train.stderr[-3000:]  # the test table printed after fit used to stop here
    assert RAW.search(train.stdout + train.stderr) is None, repr(RAW.search(train.stdout + train.stderr))
    assert "test/acc_class/[/circle]" in train.stdout and "test/acc_class/ring\\x1b[2J" in train.stdout
    # the skipped sample's warning (a log record: pytest holds it rather than the command's stderr)
    warnings = [record.getMessage() for record in caplog.records if record.name == "project.data"]
    assert any("skipped unreadable train sample bad\\x1b[2J\\u202e in" in line for line in warnings), warnings
    assert not any(RAW.search(line) for line in warnings), warnings

    checkpoint = tmp_path / "logs" / "hostile" / "version_0" / "checkpoints" / "best.ckpt"
    evaluated = run_here("project.evaluate", f"--ckpt_path={checkpoint}", *flags, "--split=test", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert RAW.search(evaluated.stdout + evaluated.stderr) is None
    metrics = json.loads(evaluated.stdout.strip().splitlines()[-1])
    # the metric's name is the class name as shown: markup escaped for Lightning's rich table, controls as escapes
    per_class = {key.removeprefix("test/acc_class/") for key in metrics if key.startswith("test/acc_class/")}
    assert per_class == {shown(name, markup=True) for name in HOSTILE}
    assert "\\[/circle]" in per_class and "ring\\x1b[2J" in per_class and "arrow\\" in per_class


def prediction_lines(classes: list[str], count: int) -> list[bytes]:
    """`project.predict --log_probs true` rows of `count` samples over `classes`, as JSON lines."""
    probs = [0.6, *[0.4 / (len(classes) - 1)] * (len(classes) - 1)]
    rows = []
    for i in range(count):
        log_probs = {name: round(math.log(p), 5) for name, p in zip(classes, probs, strict=True)}
        row = {"key": f"sample-{i:05d}", "pred": classes[0], "pred_index": 0, "prob": 0.6, "top_classes": classes[:1]}
        rows.append(json.dumps(row | {"top_probs": [0.6], "label": classes[i % 2], "log_probs": log_probs}) + "\n")
    return [row.encode() for row in rows]


def test_a_parquet_whose_pages_are_damaged_is_one_line_naming_it(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    from project.callbacks.predictions import write_rows

    good, damaged = tmp_path / "good.parquet", tmp_path / "damaged.parquet"
    for path in (good, damaged):
        assert write_rows(path, prediction_lines(["a", "b", "c"], 3000), log_probs=True) == 3000
    # bytes in the middle of the key column's pages overwritten; the footer (and its length and magic) kept
    data = bytearray(damaged.read_bytes())
    footer = struct.unpack("<i", data[-8:-4])[0] + 8
    column = pq.ParquetFile(damaged).metadata.row_group(0).column(0)
    start = (column.dictionary_page_offset or column.data_page_offset) + column.total_compressed_size // 2
    assert start + 64 < len(data) - footer
    data[start : start + 64] = b"\xff" * 64
    damaged.write_bytes(bytes(data))
    assert pq.ParquetFile(damaged).metadata.num_rows == 3000  # the footer still opens: only the pages fail

    result = run_here("project.ensemble", str(damaged), str(good), cwd=tmp_path)
    assert_one_line_error(result, str(damaged), "is damaged")


def test_ensemble_names_a_strangers_classes_as_text(tmp_path):
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_bytes(b"".join(prediction_lines(["a", "b", "c"], 4)))
    second.write_bytes(b"".join(prediction_lines(["a", "b", "\x1b[2Jc\u202e"], 4)))
    result = run_here("project.ensemble", str(first), str(second), cwd=tmp_path)
    assert_one_line_error(result, "other classes", "\\x1b[2Jc\\u202e")
    assert RAW.search(result.stderr) is None


# keys that a spreadsheet would run, one that looks like a negative number, one that starts with our quote
FORMULA_KEYS = ['=HYPERLINK("http://x")', "-3", "+1", "@SUM(A1)", "\tkey", "'=quoted", "'plain", "plain"]


def test_the_oracle_csv_escapes_formulas_and_reads_its_keys_back_exactly(tmp_path):
    samples = [
        {"__key__": key, "txt": text.encode()} for key, text in zip(FORMULA_KEYS, ["-12.5", "=1+1"] * 4, strict=True)
    ]
    request = write_request(tmp_path, samples, ["=neg", "pos"])[0]
    with open(request, encoding="utf-8", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["key", "label", "text"]
    cells = [cell for row in rows[1:] for cell in (row[0], row[2])]
    assert all(not cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in cells), cells
    assert rows[1][0] == '\'=HYPERLINK("http://x")' and rows[1][2] == "'-12.5" and rows[2][0] == "'-3"
    assert rows[6][0] == "''=quoted" and rows[7][0] == "''plain" and rows[8][0] == "plain"

    # a person labels the rows: one label with our quote (a spreadsheet's text), one a plain index; and a
    # spreadsheet that saved one key without its quote (it showed the cell as text and dropped the mark)
    for row, label in zip(rows[1:], ["'=neg", "1", "pos", "0", "pos", "1", "=neg", "pos"], strict=True):
        row[1] = label
    rows[3][0] = "+1"
    with open(request, "w", encoding="utf-8", newline="") as file:
        csv.writer(file).writerows(rows)
    answers = read_answers(request, FORMULA_KEYS, ["=neg", "pos"])
    assert answers.problems == []
    assert answers.labels == dict(zip(FORMULA_KEYS, [0, 1, 1, 0, 1, 1, 0, 1], strict=True))


def test_a_rounds_selection_escapes_formulas_and_reads_back_exactly(tmp_path):
    pool = ShardIndex([Shard(str(tmp_path / "pool-000000.tar"), 8), Shard(str(tmp_path / "=pool.tar"), 8)])
    selected = [Selected(key, pool.shards[i % 2].url, -0.25 * i) for i, key in enumerate(FORMULA_KEYS)]
    path = tmp_path / "selected.csv"
    write_selection(path, selected, pool)
    with open(path, encoding="utf-8", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[2] == ["'-3", str(tmp_path / "=pool.tar"), "-0.25", "1"]  # the score stays a number
    settings = SimpleNamespace(pool=pool, pool_spec="pool")
    loop = ActiveLoop("entropy", 0, settings, tmp_path, tmp_path / "labeled")
    assert loop.read_selection(path) == selected


def test_csv_cells_round_trip_every_string():
    for value in [*FORMULA_KEYS, "", "'", "''", "=", "'\r", "\r\n=x", "-", "0", "é"]:
        assert csv_value(csv_cell(value)) == value, repr(value)
        assert not str(csv_cell(value)).startswith(("=", "+", "-", "@", "\t", "\r", "\n"))
    assert csv_cell(-1.5) == -1.5 and csv_cell(3) == 3  # numbers we write are numbers to the spreadsheet too


def test_duplicates_csv_escapes_keys_and_labels_that_start_a_formula(tmp_path):
    """prepare's duplicates.csv names a stranger's keys and class names: a cell a spreadsheet would run is text."""
    from project.shards.prepare import prepare

    from .conftest import jpeg

    for label in ("=SUM(1+1)", "plain"):
        folder = tmp_path / "source" / label
        folder.mkdir(parents=True)
        for number in range(12):
            (folder / f"img{number}.jpg").write_bytes(jpeg(number * 20 + (label == "plain") * 7))
    copy = (tmp_path / "source" / "=SUM(1+1)" / "img0.jpg").read_bytes()
    (tmp_path / "source" / "=SUM(1+1)" / "@copy.jpg").write_bytes(copy)
    (tmp_path / "source" / "=SUM(1+1)" / "-copy.jpg").write_bytes(copy)
    prepare(str(tmp_path / "source"), out=tmp_path / "out", quiet=True, dedup="exact", workers=1)
    with open(tmp_path / "out" / "duplicates.csv", newline="") as stream:
        rows = list(csv.reader(stream))
    cells = [cell for row in rows[1:] for cell in row]
    assert len(rows) == 4, rows  # the header, and a group of three copies
    assert not [cell for cell in cells if cell.startswith(("=", "+", "-", "@"))], cells
    assert {csv_value(row[3]) for row in rows[1:]} == {"=SUM(1+1)"}, rows  # written as "'=SUM(1+1)", read back


def test_names_no_utf8_and_escapes_in_a_strangers_files_reach_the_terminal_escaped(tmp_path):
    """A shard folder's FIFO named with bytes that are no UTF-8 (0x9b: the 8-bit CSI; Python holds it as the
    lone surrogate \\udc9b, which a strict stdout refused with a traceback and a lenient one wrote back raw), a
    folder whose only shard is a FIFO named with an escape, a text listing whose header holds one: `index`
    lists the name escaped, and each one-line error names the entry or the column escaped."""
    from project.data.paths import check_output
    from project.errors import UserError

    from .conftest import jpeg

    shards = tmp_path / "shards"
    shards.mkdir()
    with tarfile.open(shards / "good.tar", "w") as tar:
        for name, data in [("s0.jpg", jpeg(1)), ("s0.cls", b"0")]:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    os.mkfifo(os.fsencode(shards) + b"/bad\xff\x9b31m.tar")
    result = run_here("project.shards.index", str(shards), f"--out={tmp_path / 'index.json'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bad\\udcff\\udc9b31m.tar: a FIFO" in result.stdout and "\udc9b" not in result.stdout

    only = tmp_path / "only"
    only.mkdir()
    os.mkfifo(only / "x\x1b]0;pwned\x07.tar")
    for module in ("project.shards.prepare", "project.shards.index"):
        result = run_here(module, str(only), f"--out={tmp_path / 'out' / 'index.json'}", cwd=tmp_path)
        assert_one_line_error(result, "x\\x1b]0;pwned\\x07.tar")
        assert RAW.search(result.stderr) is None, result.stderr

    listing = tmp_path / "texts.csv"
    listing.write_text("te\x1b[2Jxt\u202e,label\nhello,a\n")
    for flags in ([], ["--text=true"]):
        result = run_here("project.shards.prepare", str(listing), f"--out={tmp_path / 'out'}", *flags, cwd=tmp_path)
        assert_one_line_error(result, "te\\x1b[2Jxt\\u202e")
        assert RAW.search(result.stderr) is None, result.stderr

    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / "model\x1b[2J.onnx").symlink_to(tmp_path / "texts.csv")  # a link out, planted in a run
    with pytest.raises(UserError) as error:
        check_output(tmp_path / "out" / "model\x1b[2J.onnx", tmp_path / "out")
    assert RAW.search(str(error.value)) is None and "model\\x1b[2J.onnx is a link out of" in str(error.value)


def test_ensemble_skips_rows_whose_keys_labels_or_class_names_are_no_text(tmp_path):
    """JSON's `\\udcff` makes a key or label no UTF-8 file or SQLite table holds (a traceback from the join); a
    Parquet map's keys may be numbers, bytes or times (a traceback comparing or writing them); a column named
    with bytes that are no UTF-8 broke pyarrow's footer: each row is skipped and counted, the file one line."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    lines = prediction_lines(["a", "b"], 4)
    first.write_bytes(b"".join(lines))
    rows = [json.loads(line) for line in lines]
    rows[1]["key"], rows[2]["label"] = "\udcff", "\ud800"  # written by json.dumps as \udcff, \ud800
    second.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "ensemble.jsonl"
    result = run_here("project.ensemble", str(first), str(second), f"--out={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 rows skipped (line 2: not a row with a key; line 3: a label that is not UTF-8)" in result.stderr
    assert [json.loads(line)["key"] for line in out.read_text().splitlines()] == ["sample-00000", "sample-00003"]

    log_probs = [math.log(0.6), math.log(0.4)]
    for name, type_, classes in [("int", pa.int64(), [0, 1]), ("bytes", pa.binary(), [b"a", b"b"])]:
        table = pa.table(
            {
                "key": [f"sample-{i:05d}" for i in range(4)],
                "label": ["a", "b", "a", "b"],
                "log_probs": pa.array(
                    [list(zip(classes, log_probs, strict=True))] * 4, type=pa.map_(type_, pa.float64())
                ),
            }
        )
        pq.write_table(table, tmp_path / f"{name}.parquet")
        result = run_here("project.ensemble", str(first), str(tmp_path / f"{name}.parquet"), cwd=tmp_path)
        assert_one_line_error(result, "no sample is in every input")
        assert "4 rows skipped (line 1: log_probs whose classes are not names;" in result.stderr

    named = tmp_path / "named.parquet"
    table = pa.table(
        {"key": ["k0"], "label": ["a"], "log_probs": pa.array([[("a", 0.0)]], pa.map_(pa.string(), pa.float64()))}
    )
    pq.write_table(table.append_column("xq_col", pa.array([1])), named, store_schema=False)
    named.write_bytes(named.read_bytes().replace(b"xq_col", b"\xadq_col"))  # the footer's column name, no UTF-8
    result = run_here("project.ensemble", str(first), str(named), cwd=tmp_path)
    assert_one_line_error(result, str(named), "cannot be read as Parquet")


def test_oracle_keys_that_start_or_end_with_a_space_read_back_exactly(tmp_path):
    """A sample key is a stranger's: " lead", "trail " and " " were stripped when read back, and their answers
    refused as keys never asked for; a key a spreadsheet padded with spaces is still found."""
    keys = [" lead", "trail ", " ", "'", "'=x", "plain"]
    request = write_request(tmp_path, [{"__key__": key, "txt": b"a text"} for key in keys], ["neg", "pos"])[0]
    with open(request, encoding="utf-8", newline="") as file:
        rows = list(csv.reader(file))
    for row in rows[1:]:
        row[1] = "pos"
    rows[-1][0] = "  plain "
    with open(request, "w", encoding="utf-8", newline="") as file:
        csv.writer(file).writerows(rows)
    answers = read_answers(request, keys, ["neg", "pos"])
    assert answers.problems == [] and answers.labels == dict.fromkeys(keys, 1)
