"""Every store fsspec knows, through the project's one entry (`project/data/stores.py`): gs://, gcs://, az://,
abfs:// and hf:// read from an in-process stand-in registered under the scheme's name (tests/stores_standin.py),
holding the tiny demo: a shard byte-exact, an index whose relative shards stay on the scheme, a stream that
reads every sample exactly once, the download cache, a missing object and a library's error in one line.
s3:// is read by the real s3fs from moto's server in tests/test_s3.py.

A missing package is one line naming it and the project's extra; the real gcsfs, adlfs and huggingface_hub
filesystems are built offline from their own standard credentials (the project passes none), and no credential
a store's library may quote in an error reaches a line the project prints.

The stand-in is registered in this process only: DataLoader workers started by forkserver or spawn would not
know it, so streams here are iterated in this process, with no DataLoader workers.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest
from fsspec.registry import _registry

from project.data.health import SkipLedger
from project.data.remote import cache_name, open_url
from project.data.samples import read_samples
from project.data.shard_index import ShardIndex, read_index
from project.data.specs import resolve_shards
from project.data.stores import filesystem
from project.data.stream import ShardStream
from project.errors import ShardError, UserError, run_main
from project.redact import redact_text
from project.tasks.image.data import ImageShards
from project.tasks.image.task import ImageTask

from .stores_standin import LibraryError, register

# each scheme's stand-in, and where the tiny demo lies in it (a bucket, a container, a dataset repository)
BASES = {
    "gs": "gs://bucket",
    "gcs": "gcs://bucket",
    "az": "az://container",
    "abfs": "abfs://container",
    "hf": "hf://datasets/org/demo",
}
SHARD = "val/val-000000.tar"  # 100 samples of the tiny demo


class Store:
    """A stand-in store for one scheme holding the tiny demo at `base`."""

    def __init__(self, scheme: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scheme, self.base, self.root = scheme, BASES[scheme], root
        self.cls = register(monkeypatch, scheme, root)

    def path(self, relative: str) -> str:
        """The stand-in's path of `relative` under the base (as `filesystem` strips the scheme)."""
        return f"{self.base.split('://', 1)[1]}/{relative}"


@pytest.fixture(params=sorted(BASES))
def store(request, tiny_demo, tmp_path, monkeypatch) -> Store:
    root = tmp_path / "store"
    place = root / BASES[request.param].split("://", 1)[1]
    place.parent.mkdir(parents=True)
    place.symlink_to(tiny_demo, target_is_directory=True)
    return Store(request.param, root, monkeypatch)


def local_keys(tiny_demo: Path, shard: str = SHARD) -> list[str]:
    return [sample["__key__"] for sample in read_samples(str(tiny_demo / shard), extensions=frozenset())]


def demo_task(index: ShardIndex) -> ImageTask:
    """The image task of the demo's classes (as its index names them)."""
    return ImageShards(root=None, image_size=16, classes=index.extra["classes"], num_workers=0).task


def stream_keys(index: ShardIndex, **options) -> list[str]:
    stream = ShardStream(shards=index.shards, task=demo_task(index), stage="test", batch_size=16, **options)
    return [key for batch in stream for key in batch.keys]


def test_a_shard_is_read_byte_exact_by_ranges(store, tiny_demo):
    fs, path = filesystem(f"{store.base}/{SHARD}")
    assert isinstance(fs, store.cls) and path == store.path(SHARD)
    with open_url(f"{store.base}/{SHARD}") as stream:
        data = b"".join(iter(lambda: stream.read(4096), b""))  # as the tar reader reads: a piece at a time
    assert data == (tiny_demo / SHARD).read_bytes()
    assert len({start for _, start, _ in store.cls.fetches}) > 1  # by ranges, as a store's client reads


def test_an_index_resolves_its_relative_shards_on_the_same_scheme(store, tiny_demo):
    index = read_index(f"{store.base}/val/shardindex.json")
    local = read_index(str(tiny_demo / "val" / "shardindex.json"))
    assert [shard.url for shard in index.shards] == [f"{store.base}/val/val-{n:06d}.tar" for n in range(2)]
    assert [(s.nsamples, s.filesize) for s in index.shards] == [(s.nsamples, s.filesize) for s in local.shards]


@pytest.mark.parametrize("cached", [False, True], ids=["streamed", "cached"])
def test_a_stream_reads_every_sample_exactly_once(store, tiny_demo, tmp_path, cached):
    index = resolve_shards(f"{store.base}/test/shardindex.json")
    expected = sorted(key for n in range(2) for key in local_keys(tiny_demo, f"test/test-{n:06d}.tar"))
    cache = tmp_path / "cache"
    options = {"cache_dir": str(cache)} if cached else {}
    keys = stream_keys(index, **options)
    assert sorted(keys) == expected and len(keys) == 150
    if not cached:
        return
    assert sorted(p.name for p in cache.iterdir()) == sorted(cache_name(shard.url) for shard in index.shards)
    store.cls.fetches.clear()
    assert stream_keys(index, **options) == keys  # the second pass reads the copies, not the store
    assert store.cls.fetches == []


def test_a_missing_object_is_one_line_naming_it(store):
    url = f"{store.base}/val/val-000009.tar"
    with pytest.raises(ShardError) as opening:
        next(read_samples(url))
    base = store.base.rsplit("/", 1)[0] + "/gone"  # a bucket beside the demo's: an index naming a shard it lacks
    folder = store.root / base.split("://", 1)[1]
    folder.mkdir(parents=True)
    entries = {"shardlist": [{"url": "gone.tar", "nsamples": 3}], "classes": ["a", "b"]}
    (folder / "shardindex.json").write_text(json.dumps(entries))
    with pytest.raises(ShardError) as streaming:
        stream_keys(resolve_shards(f"{base}/shardindex.json"))
    for error, shard in ((opening.value, url), (streaming.value, f"{base}/gone.tar")):
        line = str(error)
        assert "\n" not in line and shard in line and "No such object" in line, line


@pytest.mark.parametrize("when", ["open", "read"])
def test_a_library_error_is_one_line_naming_the_shard(store, tiny_demo, when):
    """A store's own error (no OSError) when the shard is opened, or after its first range was read."""
    store.cls.faults[(store.path(SHARD), when)] = LibraryError("503 backend unavailable\n  retry later")
    url = f"{store.base}/{SHARD}"
    samples = read_samples(url)
    if when == "read":  # the first range's samples come, then the error
        assert next(samples)["__key__"] == local_keys(tiny_demo)[0]
    with pytest.raises(ShardError) as reading:
        list(samples)
    with pytest.raises(ShardError) as streaming:
        stream_keys(resolve_shards(f"{store.base}/val/shardindex.json"))
    for error in (reading.value, streaming.value):
        line = str(error)
        assert "\n" not in line and url in line and "LibraryError: 503 backend unavailable retry later" in line


# -- a missing package, an unknown scheme ---------------------------------------------------------------------

PACKAGES = [
    ("s3", "s3fs", "s3"),
    ("gs", "gcsfs", "gcs"),
    ("gcs", "gcsfs", "gcs"),
    ("az", "adlfs", "azure"),
    ("abfs", "adlfs", "azure"),
    ("hf", "huggingface_hub", "hf"),
]


@pytest.mark.parametrize(("scheme", "package", "extra"), PACKAGES)
def test_a_missing_package_is_one_line_naming_it_and_its_extra(monkeypatch, capsys, scheme, package, extra):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed: importing it raises ImportError
    monkeypatch.delitem(_registry, scheme, raising=False)  # fsspec's class of the scheme, if imported before
    url = f"{scheme}://user:pa55word@bucket/val/shardindex.json?sig=PLANTED-SIG"
    with pytest.raises(UserError) as error:
        filesystem(url)
    line = str(error.value)
    assert "\n" not in line and f"pip install {package} " in line and f'".[{extra}]"' in line, line
    assert "pa55word" not in line and "PLANTED-SIG" not in line and f"{scheme}://***@bucket" in line, line
    with pytest.raises(SystemExit) as stop:  # what a tool prints: the same line (read_index passes it on)
        run_main(lambda: read_index(url))
    printed = capsys.readouterr().err
    assert stop.value.code == 2 and printed == f"error: {line}\n"


def test_an_unknown_scheme_or_a_package_fsspec_names_is_one_line(monkeypatch):
    with pytest.raises(UserError) as unknown:
        filesystem("nosuchstore://bucket/a.tar?sig=PLANTED-SIG")
    monkeypatch.setitem(sys.modules, "ocifs", None)  # a scheme the project declares no extra for
    monkeypatch.delitem(_registry, "oci", raising=False)
    with pytest.raises(UserError) as undeclared:
        filesystem("oci://bucket@namespace/a.tar")
    for error, said in ((unknown, "Protocol not known: nosuchstore"), (undeclared, "ocifs")):
        line = str(error.value)
        assert "\n" not in line and said in line and "PLANTED-SIG" not in line, line
    assert "install the fsspec filesystem for its scheme" in str(undeclared.value)


# -- each library's own credentials, found without a network call ------------------------------------------------

HF_TOKEN = "hf_" + "PlantedHubToken" + "x" * 19  # "hf_" and 34 letters, as the Hub issues them
ACCOUNT_KEY = base64.b64encode(b"planted azure storage account key".ljust(64, b"!")).decode()  # 88 characters
CONNECTION = (
    f"DefaultEndpointsProtocol=https;AccountName=plantedacct;AccountKey={ACCOUNT_KEY};EndpointSuffix=core.windows.net"
)
SAS_SIG = "PLANTEDsasSig%2B9f8e7d6c5b4a%3D"
SAS = f"sv=2022-11-02&ss=b&srt=co&sp=rl&se=2031-01-01T00:00:00Z&spr=https&sig={SAS_SIG}"
GOOGLE_TOKEN = "ya29.PlantedGoogleAccessToken_0123456789"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No socket may connect nor a name resolve, and no credential of this machine's own is found: every variable
    of the stores' libraries is cleared, their config folders point at an empty one."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network call: {args[1:]!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for name in [n for n in os.environ if n.startswith(("AWS_", "AZURE_", "GOOGLE_", "GCE_", "CLOUDSDK_", "HF_"))]:
        monkeypatch.delenv(name)
    for name in ("CLOUDSDK_CONFIG", "HF_HOME", "AZURE_CONFIG_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "no-config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def service_account(folder: Path) -> tuple[Path, dict]:
    """A Google service account's JSON key file, its RSA key made here (google-auth parses it when loaded)."""
    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")  # moto's, azure's
    rsa = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.rsa")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    info = {
        "type": "service_account",
        "project_id": "planted-project",
        "private_key_id": "0123456789abcdef",
        "private_key": pem.decode(),
        "client_email": "reader@planted-project.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path = folder / "service-account.json"
    path.write_text(json.dumps(info))
    return path, info


def test_gcsfs_finds_google_application_credentials_offline(offline, monkeypatch):
    gcsfs = pytest.importorskip("gcsfs")
    path, info = service_account(offline)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    gcsfs.GCSFileSystem.clear_instance_cache()
    fs, where = filesystem(f"gs://bucket/{SHARD}")
    assert isinstance(fs, gcsfs.GCSFileSystem) and where == f"bucket/{SHARD}"
    assert fs.credentials.method == "google_default"  # google.auth.default(): the variable, else gcloud's login
    assert fs.credentials.credentials.service_account_email == info["client_email"]
    assert fs.project == "planted-project"
    gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.mark.parametrize("kind", ["key", "connection string", "sas", "az login"])
def test_adlfs_finds_azure_storage_variables_offline(offline, monkeypatch, kind):
    adlfs = pytest.importorskip("adlfs")
    variables = {
        "key": {"AZURE_STORAGE_ACCOUNT_NAME": "plantedacct", "AZURE_STORAGE_ACCOUNT_KEY": ACCOUNT_KEY},
        "connection string": {"AZURE_STORAGE_CONNECTION_STRING": CONNECTION},
        "sas": {"AZURE_STORAGE_ACCOUNT_NAME": "plantedacct", "AZURE_STORAGE_SAS_TOKEN": SAS},
        "az login": {"AZURE_STORAGE_ACCOUNT_NAME": "plantedacct"},  # adlfs then asks DefaultAzureCredential
    }[kind]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    fs, where = filesystem(f"az://container/{SHARD}")
    assert isinstance(fs, adlfs.AzureBlobFileSystem) and where == f"container/{SHARD}"
    assert fs.service_client.account_name == "plantedacct"
    credential = fs.service_client.credential
    if kind in ("key", "connection string"):
        assert credential.account_key == ACCOUNT_KEY
    elif kind == "sas":
        assert SAS_SIG in fs.service_client.url
    else:
        assert not fs.anon and type(credential).__name__ == "DefaultAzureCredential"
    adlfs.AzureBlobFileSystem.clear_instance_cache()


def test_huggingface_hub_finds_hf_token_offline(offline, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    fs, where = filesystem(f"hf://datasets/org/demo/{SHARD}")
    assert isinstance(fs, huggingface_hub.HfFileSystem) and where == f"datasets/org/demo/{SHARD}"
    assert fs.token is None  # the project passes none: the library reads HF_TOKEN, else `hf auth login`'s file
    assert fs._api._build_hf_headers()["authorization"] == f"Bearer {HF_TOKEN}"


# -- no credential a store's library may quote reaches a line ------------------------------------------------------


@functools.cache
def planted_key_file() -> tuple[str, list[str]]:
    """A service account's JSON key file's text, and the lines of its private key (each a secret)."""
    folder = Path(tempfile.mkdtemp())
    path, info = service_account(folder)
    text = path.read_text()
    shutil.rmtree(folder)
    return text, [line for line in info["private_key"].splitlines() if "PRIVATE KEY" not in line]


def planted_texts() -> list[tuple[str, list[str]]]:
    """Each form a credential takes in a library's error text, and the secrets that must not show."""
    key_file, key_lines = planted_key_file()
    return [
        (f"cannot parse {CONNECTION}", [ACCOUNT_KEY]),
        (f"BlobEndpoint=https://plantedacct.blob.core.windows.net/;SharedAccessSignature={SAS}", [SAS_SIG]),
        (f"AZURE_STORAGE_SAS_TOKEN={SAS}", [SAS_SIG]),
        (f"Server failed to authenticate the request ({SAS})", [SAS_SIG]),
        (f"https://plantedacct.blob.core.windows.net/container/a.tar?{SAS} 403", [SAS_SIG]),
        (f"AzureBlobFileSystem(account_key='{ACCOUNT_KEY}')", [ACCOUNT_KEY]),
        (f"the key {ACCOUNT_KEY} was refused", [ACCOUNT_KEY]),
        (f"401 Unauthorized: invalid token {HF_TOKEN} for datasets/org/demo", [HF_TOKEN]),
        (f"could not load {key_file}", key_lines),
        (f"key: {json.loads(key_file)['private_key']}", key_lines),
        (f"Bearer token {GOOGLE_TOKEN} expired", [GOOGLE_TOKEN]),
    ]


def test_redact_text_hides_every_form_of_a_stores_credential():
    for text, secrets in planted_texts():
        shown = redact_text(text)
        assert "***" in shown and not [secret for secret in secrets if secret in shown], (text, shown)
    kept = "cannot read gs://bucket/val/val-000000.tar: AccountName=plantedacct, max_tokens=64, sv=2022-11-02"
    assert redact_text(kept) == kept  # names, plain settings and a SAS's dates stay


def test_a_library_error_quoting_credentials_prints_none_of_them(store, capsys, caplog):
    texts = planted_texts()
    secrets = [secret for _, planted in texts for secret in planted]
    url = f"{store.base}/{SHARD}"
    store.cls.faults[(store.path(SHARD), "read")] = LibraryError("\n".join(text for text, _ in texts))
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: list(read_samples(url)))
    printed = capsys.readouterr().err
    assert stop.value.code == 2 and printed.count("\n") == 1 and url in printed, printed
    assert not [secret for secret in secrets if secret in printed], printed
    with pytest.raises(ShardError) as error:
        list(read_samples(url))
    with caplog.at_level(logging.WARNING, logger="project.data"):  # a skipped sample's warning, in training
        SkipLedger("train", epoch=0, planned=1000, max_fraction=1.0).record([(url, "val-000", str(error.value))])
    assert "LibraryError" in caplog.text and not [secret for secret in secrets if secret in caplog.text]


class _ClientError(Exception):
    """A library's own error type, as google.auth's or azure's are (not a builtin)."""


_ClientError.__module__ = "google.auth.exceptions"


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("All connection methods have failed!\nsee sig=AbCdEf0123456789AbCdEf0123456789"),
        _ClientError("could not refresh: AccountKey=c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2Vj;"),
        OSError("metadata server unreachable"),
    ],
)
def test_a_filesystem_that_cannot_start_is_one_line_with_no_secret(monkeypatch, error):
    import fsspec.core

    def refuse(url, **kwargs):
        raise error

    monkeypatch.setattr(fsspec.core, "url_to_fs", refuse)
    with pytest.raises(UserError) as raised:
        filesystem("gs://bucket/shard.tar")
    line = str(raised.value)
    assert "\n" not in line and line.startswith("cannot open gs://bucket/shard.tar: "), line
    assert "AbCdEf0123456789AbCdEf0123456789" not in line and "c2VjcmV0c2Vj" not in line, line


def test_a_bug_in_a_filesystem_stays_a_traceback(monkeypatch):
    import fsspec.core

    def broken(url, **kwargs):
        raise TypeError("a bug, not the user's input")

    monkeypatch.setattr(fsspec.core, "url_to_fs", broken)
    with pytest.raises(TypeError):
        filesystem("gs://bucket/shard.tar")
