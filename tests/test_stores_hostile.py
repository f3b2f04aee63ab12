"""The store entry (`project/data/stores.py`) and the redaction of stores' credentials (`project/redact.py`), tried
as a stranger who controls an index, a url in it, a store's error text or a server: no url an index may name opens
anything but storage (a url that lost its slashes opened a local file), every fsspec form a url cannot drive is one
line (no traceback), no credential of s3, gs, az or hf reaches a line or a redacted url (percent-encoded, in a path
segment, as a header's name), redaction stays linear on a megabyte of text, and what users need to read stays.
"""

from __future__ import annotations

import time

import pytest

from project.data.samples import read_samples
from project.data.shard_index import url_problem
from project.data.stores import filesystem
from project.errors import UserError, run_main
from project.redact import redact, redact_text

from .stores_standin import register

# -- a url an index may name opens storage only ------------------------------------------------------------------


@pytest.mark.parametrize("url", ["gs:/planted/shard.tar", "s3:planted/shard.tar", "hf:/planted/shard.tar"])
def test_a_store_url_without_its_slashes_never_opens_a_local_file(tmp_path, monkeypatch, url):
    # fsspec reads `gs:/x` (no `://`) as a local path: a folder named `gs:` in the working folder (a mistaken
    # `--out gs:/b/ds` makes one) was then read for a remote index's entry
    monkeypatch.chdir(tmp_path)
    planted = tmp_path / url
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"a local file")
    assert url_problem(url, from_remote_index=True) is not None
    with pytest.raises(UserError, match="://"):
        filesystem(url)


def test_an_upper_case_scheme_opens_its_store_as_the_index_check_accepts_it(tmp_path, monkeypatch):
    (tmp_path / "bucket").mkdir()
    (tmp_path / "bucket" / "a.tar").write_bytes(b"x" * 10)
    register(monkeypatch, "gs", tmp_path)
    assert url_problem("GS://bucket/a.tar", from_remote_index=True) is None
    fs, path = filesystem("GS://bucket/a.tar")
    assert path == "bucket/a.tar" and fs.cat_file(path) == b"x" * 10


@pytest.mark.parametrize(
    "url", ["reference://x.json", "dir://x", "zip://a.tar", "tar://a", "simplecache://b/x", "adl://store/x.tar"]
)
def test_a_scheme_a_url_cannot_drive_is_one_line(url):
    with pytest.raises(UserError) as raised:
        filesystem(url)
    assert "\n" not in str(raised.value) and str(raised.value).startswith(f"cannot open {url}: ")


def test_an_index_naming_a_retired_azure_gen1_url_is_refused_and_reading_one_is_one_line(capsys):
    assert url_problem("adl://store/x.tar", from_remote_index=True) is not None  # adlfs dropped Gen1
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: list(read_samples("adl://store/x.tar")))
    printed = capsys.readouterr().err
    assert stop.value.code == 2 and printed.count("\n") == 1 and "abfs://" in printed, printed


# -- no credential reaches a line or a redacted url ---------------------------------------------------------------

SIG = "Zm9vYmFyQmF6UXV4MTIzNDU2Nzg5MA"
HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        (f"https://acct.blob.core.windows.net/c/x.tar%3Fsv%3D2022-11-02%26sig%3D{SIG}", SIG),  # a SAS, encoded
        (f"https://h/c/sig%3D{SIG[:12]}/x.tar", SIG[:12]),  # encoded, shorter than a token
        (f"hf://datasets/org/{HF}/x.tar", HF),  # a token as a path segment (the journal's redacted url)
        (f"https://h/hf%5F{HF[3:]}/x.tar", HF[3:]),
        ("abfs://container@acct.dfs.core.windows.net/x.tar?sv=2022-11-02&sig=" + SIG, SIG),
        ("abfs://container:" + SIG + "@acct.dfs.core.windows.net/x.tar", SIG),
        ("az://container/x.tar?account_key=" + SIG, SIG),
        ("gs://bucket/x.tar?access_token=ya29." + SIG, SIG),
        ("gs://bucket/x.tar#" + SIG[:10], SIG[:10]),
    ],
)
def test_a_store_url_shows_no_secret_also_encoded_or_in_its_path(url, secret):
    for shown in (redact(url), redact_text(f"cannot open {url}: 403")):
        assert secret not in shown and "***" in shown, shown


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("botocore: X-Amz-Security-Token: FwoGZXIvYXdzEBYaDHqa0AP1", "FwoGZXIvYXdzEBYaDHqa0AP1"),
        ("headers {'x-amz-security-token': 'FwoGZXIvYXdzEBYaDHqa0AP1'}", "FwoGZXIvYXdzEBYaDHqa0AP1"),
        ("X-Amz-Signature=abcdef0123456789abcdef0123456789 refused", "abcdef0123456789abcdef0123456789"),
        ("Credential=ASIAIOSFODNN7EXAMPLE/20240101/us-east-1/s3/aws4_request", "ASIAIOSFODNN7EXAMPLE"),
        ("the key AKIAIOSFODNN7EXAMPLE does not exist", "AKIAIOSFODNN7EXAMPLE"),
        ("S3FileSystem(key='x', secret='wJalrXUtnFEMIK7MDENGbPxRfiCY')", "wJalrXUtnFEMIK7MDENGbPxRfiCY"),
        ("AZURE_STORAGE_KEY=c2VjcmV0c2VjcmV0c2VjcmV0", "c2VjcmV0c2VjcmV0c2VjcmV0"),
        ("api_key: c2VjcmV0c2VjcmV0c2VjcmV0", "c2VjcmV0c2VjcmV0c2VjcmV0"),
        (f"cannot parse AccountKey%3D{SIG}%3B", SIG),
        (f"query sig%3d{SIG}", SIG),
    ],
)
def test_aws_and_encoded_credentials_in_a_librarys_text_are_hidden(text, secret):
    shown = redact_text(text)
    assert secret not in shown and "***" in shown, shown


@pytest.mark.parametrize(
    "text",
    [
        "cannot open abfs://container@acct.dfs.core.windows.net/train/shard-000001.tar: 404",
        "cannot open az://images/train/ImageNet-train-000001.tar: not found",
        "hf://datasets/timm/imagenet-1k-wds@main/imagenet1k-train-0001.tar is missing",
        "class 'golden_retriever' has no samples in s3://my-bucket-2024/train",
        "Basic settings of the augmentation are kept",
        "data.pad_token=[PAD], max_tokens=64, sample key=abc: ValueError: bad label",
    ],
)
def test_what_users_need_to_read_stays(text):
    assert redact_text(text) == text


# -- redaction stays linear: it runs on every warning line --------------------------------------------------------

MEGABYTE = 1 << 20


@pytest.mark.parametrize(
    "text",
    [
        "a." * (MEGABYTE // 2) + " ://",  # every `.` a word boundary: the scheme was scanned from each (minutes)
        "a+" * (MEGABYTE // 2) + " ://x",
        "1-" * (MEGABYTE // 2) + "://x",
        "http://" + "." * MEGABYTE,
        "'pipe:" * (MEGABYTE // 6),
        "-----BEGIN " + "A " * (MEGABYTE // 2) + "PRIVATE KEY-----",
        "a_" * (MEGABYTE // 2) + "=",
        "x-amz-" * (MEGABYTE // 6) + "=",
        "Basic " + "a" * MEGABYTE,
        "https://h/" + "%3D" * (MEGABYTE // 3),
        "https://h/" + "Ab1/" * (MEGABYTE // 4),
        ("sig=" + "a." * 5 + "://hf_" + "-----BEGIN ") * (MEGABYTE // 40) + "PRIVATE KEY-----",
    ],
)
def test_redaction_of_a_hostile_megabyte_is_linear(text):
    start = time.perf_counter()
    redact_text(text)
    assert time.perf_counter() - start < 5.0  # about 0.1 s each on a loaded 2-core machine
