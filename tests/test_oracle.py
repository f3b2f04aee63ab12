"""The oracle's CSV round trip: a request to label (CSV, classes, contact sheet) and the filled answers."""

from __future__ import annotations

import csv
import io

import pytest
from PIL import Image

from project.active.oracle import REQUEST, SHEET, read_answers, write_request
from project.errors import UserError

CLASSES = ["cat", "dog", "Bird", "bird"]


def jpeg(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (value, value, value)).save(buffer, format="JPEG")
    return buffer.getvalue()


def image_samples(count: int) -> list[dict]:
    return [{"__key__": f"img{i:03d}", "__url__": "pool-000000.tar", "jpg": jpeg(20 * i)} for i in range(count)]


def text_samples(count: int) -> list[dict]:
    return [
        {"__key__": f"doc{i}", "__url__": "pool-000000.tar", "txt": f"line one {i}\nline two\r\n{'x' * 300}".encode()}
        for i in range(count)
    ]


def rows_of(path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as file:
        return list(csv.reader(file))


def fill(path, labels: dict[str, str]) -> None:
    """Put labels into a written request, as a person would, keeping the other columns."""
    rows = rows_of(path)
    for row in rows[1:]:
        row[1] = labels.get(row[0], "")
    with open(path, "w", encoding="utf-8", newline="") as file:
        csv.writer(file).writerows(rows)


def write_raw(path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def test_round_trip_images_and_text(tmp_path):
    images = image_samples(3)
    written = write_request(tmp_path / "images", images, CLASSES)
    assert [p.name for p in written] == [REQUEST, "classes.txt", SHEET]
    assert (tmp_path / "images" / "classes.txt").read_text().splitlines() == CLASSES
    assert rows_of(written[0]) == [["key", "label"], ["img000", ""], ["img001", ""], ["img002", ""]]
    fill(written[0], {"img000": "cat", "img001": "1", "img002": "CAT"})
    answers = read_answers(written[0], [s["__key__"] for s in images], CLASSES)
    assert answers.labels == {"img000": 0, "img001": 1, "img002": 0}
    assert list(answers.labels) == ["img000", "img001", "img002"]
    assert answers.problems == [] and answers.unanswered == []

    texts = text_samples(2)
    written = write_request(tmp_path / "texts", texts, CLASSES)
    assert [p.name for p in written] == [REQUEST, "classes.txt"]
    fill(written[0], {"doc0": "Bird", "doc1": "3"})
    answers = read_answers(written[0], ["doc0", "doc1"], CLASSES)
    assert answers.labels == {"doc0": 2, "doc1": 3}
    assert answers.problems == [] and answers.unanswered == []


def test_text_preview_in_csv(tmp_path):
    (request, _) = write_request(tmp_path, text_samples(2), CLASSES)
    rows = rows_of(request)
    assert rows[0] == ["key", "label", "text"]
    preview = rows[1][2]
    assert preview.startswith("line one 0 line two xxx")
    assert preview == "line one 0 line two " + "x" * 179  # the first 200 characters; CRLF is one newline
    assert rows[2][0] == "doc1" and rows[2][1] == ""


def test_every_bad_row_is_one_problem_and_good_rows_pass(tmp_path):
    path = tmp_path / REQUEST
    write_raw(
        path,
        "key,label,text\n"  # line 1
        "a,cat,preview\n"  # 2: good
        "b,horse,\n"  # 3: unknown class
        "c,7\n"  # 4: index out of range
        "\n"  # 5: blank, ignored
        "stranger,dog\n"  # 6: not asked for
        ",dog\n"  # 7: no key
        "d,bIRD\n"  # 8: case-insensitive but not unique
        "e,dog\n"  # 9: duplicate ...
        "e,dog\n"  # 10: ... both rejected
        "f,-1\n"  # 11: negative index
        "g,\n"  # 12: unanswered, not a problem
        "h,Dog\n",  # 13: good, unique case-insensitive match
    )
    asked = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
    answers = read_answers(path, asked, CLASSES)
    assert answers.labels == {"a": 0, "h": 1}
    lines = [int(p.split(" line ")[1].split(":")[0]) for p in answers.problems]
    assert lines == [3, 4, 6, 7, 8, 9, 10, 11]
    assert all(p.startswith(f"{REQUEST} line ") for p in answers.problems)
    problems = dict(zip(lines, answers.problems, strict=True))
    assert "'horse'" in problems[3] and "expected one of cat, dog, Bird, bird" in problems[3]
    assert "out of range" in problems[4] and "out of range" in problems[11]
    assert "not asked" in problems[6]
    assert "no key" in problems[7]
    assert "several classes" in problems[8]
    assert "lines 9, 10" in problems[9] and "lines 9, 10" in problems[10]
    assert answers.unanswered == ["g", "i"]  # an empty cell, and a key left out of the file


def test_unknown_class_lists_at_most_ten(tmp_path):
    classes = [f"class{i}" for i in range(25)]
    path = tmp_path / REQUEST
    write_raw(path, "key,label\na,nope\n")
    (problem,) = read_answers(path, ["a"], classes).problems
    assert "class9," in problem and "class10" not in problem and "25 classes" in problem


def test_excel_bom_and_extra_columns(tmp_path):
    path = tmp_path / REQUEST
    path.write_bytes("\ufeffKey,Label,text,notes\r\na,dog,x,y\r\n".encode())
    assert read_answers(path, ["a"], CLASSES).labels == {"a": 1}


def test_missing_file_or_columns_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no answers file"):
        read_answers(tmp_path / REQUEST, ["a"], CLASSES)
    path = tmp_path / REQUEST
    write_raw(path, "id,class\na,cat\n")
    with pytest.raises(UserError, match=REQUEST):
        read_answers(path, ["a"], CLASSES)
    write_raw(path, "")
    with pytest.raises(UserError, match="'key' and 'label'"):
        read_answers(path, ["a"], CLASSES)


def test_contact_sheet_has_a_tile_per_sample(tmp_path):
    sizes = []
    for count in (1, 4, 9):
        write_request(tmp_path / str(count), image_samples(count), CLASSES)
        with Image.open(tmp_path / str(count) / SHEET) as sheet:
            sizes.append(sheet.size)
    assert sizes[0][0] < sizes[1][0] < sizes[2][0] and sizes[0][1] < sizes[1][1] < sizes[2][1]
    # the same tile grid as project.shards.inspect.contact_sheet: ceil(sqrt(n)) columns of 96-pixel tiles
    assert sizes[2] == (3 * 96, 3 * (96 + 14))


def test_undecodable_image_gets_a_placeholder(tmp_path):
    samples = image_samples(2) + [{"__key__": "broken", "__url__": "x", "png": b"not a png"}]
    written = write_request(tmp_path, samples, CLASSES)
    with Image.open(written[2]) as sheet:
        assert sheet.size == (2 * 96, 2 * (96 + 14))
        assert sheet.convert("RGB").getpixel((30, 96 + 14 + 30)) == (128, 128, 128)  # tile 3, row 2: grey


def test_writes_are_atomic(tmp_path):
    write_request(tmp_path, image_samples(2), CLASSES)
    write_request(tmp_path, image_samples(3), CLASSES)  # over an earlier request
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classes.txt", REQUEST, SHEET]
    assert len(rows_of(tmp_path / REQUEST)) == 4
    write_request(tmp_path, text_samples(1), CLASSES)  # a text round drops the earlier round's sheet
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classes.txt", REQUEST]


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    write_request(tmp_path, image_samples(2), CLASSES)
    before = (tmp_path / SHEET).read_bytes()

    def broken(tiles, path):
        path.write_bytes(b"half a png")
        raise OSError("disk full")

    monkeypatch.setattr("project.active.oracle.contact_sheet", broken)
    with pytest.raises(OSError, match="disk full"):
        write_request(tmp_path, image_samples(3), CLASSES)
    assert (tmp_path / SHEET).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classes.txt", REQUEST, SHEET]
