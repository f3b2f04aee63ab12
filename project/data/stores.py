"""Object stores through fsspec (s3://, gs://, az://, hf://, ...): the filesystem of a url, with one line naming
the package to install for its scheme, and its files read with errors that are OSErrors.

Credentials are each library's own (the AWS chain for s3fs, Google's application default credentials for gcsfs,
`AZURE_STORAGE_*` for adlfs, `HF_TOKEN` or `hf auth login` for huggingface_hub), never a flag, so that none
reaches a file of the run.
"""

from __future__ import annotations

import io
import re
from typing import IO, Any

from project.errors import UserError
from project.redact import redact, redact_text

SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def scheme_of(url: str) -> str:
    """The url's scheme in lower case ("" for a path): read by hand, since urlparse raises on a stranger's
    url such as `http://[x/y.tar` (an unclosed IPv6 host)."""
    found = SCHEME.match(url)
    return found.group(1).lower() if found else ""


class FsspecStream(io.RawIOBase):
    """An fsspec file (s3://, gs://, ...) whose errors are OSErrors, so that a reader names the shard in
    one line. The filesystem retries on its own, from the byte reached (s3fs: botocore's retries of refused
    connections, its own of cut bodies), but gives up with its libraries' errors, which are no OSErrors
    (botocore's EndpointConnectionError): they escaped the readers as tracebacks."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file

    @staticmethod
    def call(method, *args):
        try:
            return method(*args)
        except Exception as error:  # builtin ones (ImportError, ValueError, a bug's TypeError) pass as they are
            if isinstance(error, OSError) or type(error).__module__ == "builtins":
                raise
            raise OSError(" ".join(f"{type(error).__name__}: {error}".split())) from error

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.file.seekable()

    def read(self, size: int | None = -1) -> bytes:
        return self.call(self.file.read, -1 if size is None else size)

    def readinto(self, buffer: bytearray | memoryview) -> int:
        return self.call(self.file.readinto, buffer)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.call(self.file.seek, offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def close(self) -> None:
        if not self.closed:
            self.file.close()
        super().close()


# the package that gives fsspec each storage scheme, and the project's extra that installs it
STORE_PACKAGES = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
    "hf": ("huggingface_hub", "hf"),
}


def install_advice(url: str, error: ImportError | None = None) -> str:
    """What to install to read `url`'s scheme: the package and the project's extra that brings it, or for a
    scheme the project declares no extra for, fsspec's own advice (`error`: "Install ocifs to access ...")."""
    package, extra = STORE_PACKAGES.get(scheme_of(url), (None, None))
    if package is None:
        said = " ".join(str(error or "").split())
        return "install the fsspec filesystem for its scheme" + (f" ({redact_text(said)})" if said else "")
    return f'pip install {package} (or pip install -e ".[{extra}]")'


# fsspec's filesystems over another filesystem's files (a cache, an archive, a folder, a reference set): that
# other one is named by options a url cannot give (built from a url alone, `zip://a` opened the working folder)
WRAPPERS = frozenset(
    {"async_wrapper", "asyncwrapper", "blockcache", "cached", "dir", "filecache", "generic", "libarchive"}
    | {"reference", "simplecache", "tar", "zip"}
)
LOCAL_SCHEMES = ("file", "local", "data")  # fsspec's local files, and bytes held in the url itself


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of a storage url and the path within it, with one line naming the package to
    install when the scheme's filesystem is missing (not fsspec's ImportError text). No `::` chains: a url
    that holds one is refused here, since fsspec would open the chain's inner url (maybe a local file); nor a
    store's url without `://` (`gs:/b/x`), which fsspec reads as a local path, nor a wrapper (`WRAPPERS`). The
    scheme is read in lower case, as the index check reads it (`S3://b/x` is s3's)."""
    if "::" in url:
        raise UserError(f"cannot open {redact(url)}: fsspec chains (::) are not read")
    scheme = scheme_of(url)
    if len(scheme) > 1 and scheme not in LOCAL_SCHEMES and not url[len(scheme) :].startswith("://"):
        raise UserError(
            f"cannot open {redact(url)}: a store's url is {scheme}://BUCKET/PATH (fsspec reads it as a file)"
        )
    if scheme in WRAPPERS:
        raise UserError(f"cannot open {redact(url)}: fsspec's {scheme} filesystem reads another's files: give its url")
    if scheme == "adl":  # adlfs raises AttributeError for it
        raise UserError(f"cannot open {redact(url)}: Azure Data Lake Gen1 (adl://) is retired: use abfs:// or az://")
    url = scheme + url[len(scheme) :]
    try:
        import fsspec.core
    except ImportError:  # pragma: no cover - fsspec comes with lightning
        raise UserError(f"cannot open {redact(url)}: install fsspec") from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as error:
        raise UserError(f"cannot open {redact(url)}: {install_advice(url, error)}") from None
    except (ValueError, OSError, RuntimeError) as error:  # an unknown protocol; a client that cannot start
        raise UserError(f"cannot open {redact(url)}: {_one_line(error)}") from None
    except Exception as error:  # a library's own error type (google.auth's, azure's): one line, not a traceback
        if type(error).__module__ == "builtins":
            raise  # a bug's TypeError or KeyError stays a traceback
        raise UserError(f"cannot open {redact(url)}: {_one_line(error)}") from None


def _one_line(error: BaseException) -> str:
    """An error's text, its type named where it is a library's, on one line with its secrets hidden."""
    text = " ".join(str(error).split())
    named = text if type(error).__module__ == "builtins" else f"{type(error).__name__}: {text}"
    return redact_text(named)
