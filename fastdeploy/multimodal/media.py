"""Images and videos named by chat parts' URLs: `file://` paths, plain local paths, `data:` base64 URLs,
and `http(s)` URLs (fetched once, with a timeout; FastDeploy retries three times instead).

FastDeploy's chat_utils accepts http(s), data: and file:// and silently drops a plain path; here a plain
path is read like file://, and anything else is a ValueError naming the URL.
"""
from __future__ import annotations

import base64
import binascii
import io
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Union

FETCH_TIMEOUT_S = 10.0


def fetch(url: str, timeout: float = FETCH_TIMEOUT_S) -> Union[bytes, Path]:
    """The media a URL names: a local Path (file:// or a plain path) or the bytes (data:, http(s)).

    Raises TypeError for a non-str, FileNotFoundError for a missing local file, ValueError for a bad
    data: URL or an unsupported scheme, ConnectionError when an http(s) URL cannot be fetched (offline,
    timeout, HTTP error)."""
    if not isinstance(url, str):
        raise TypeError(f"a media URL must be a str, got {type(url).__name__}")
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "data":
        return _decode_data_url(url)
    if scheme in ("http", "https"):
        return _download(url, timeout)
    if scheme == "file":
        path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
    elif scheme == "" or len(scheme) == 1:  # a plain path (or a Windows drive letter)
        path = Path(url).expanduser()
    else:
        raise ValueError(f"unsupported media URL scheme {scheme!r} in {url[:100]!r}: use file://, a local path, "
                         "data:<mime>;base64,... or http(s)://")
    if not path.is_file():
        raise FileNotFoundError(f"media file {str(path)!r} (from {url[:200]!r}) does not exist")
    return path


def _decode_data_url(url: str) -> bytes:
    header, sep, payload = url[len("data:"):].partition(",")
    if not sep or not header.endswith(";base64"):
        raise ValueError(f"a data: URL must look like data:<mime>;base64,<data>, got {url[:60]!r}...")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"the data: URL's base64 payload is invalid: {e}") from e


def _download(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConnectionError(f"cannot fetch {url!r} ({reason}); without network access pass the file itself "
                              "(file://path, a local path, or a data: URL)") from e


def load_image(source: Union[bytes, Path, str]):
    """A PIL image, fully read, from a path or bytes. ValueError when the data is not an image."""
    from PIL import Image, UnidentifiedImageError

    handle = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    try:
        image = Image.open(handle)
        image.load()
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"cannot read an image from {str(source)[:100] if not isinstance(source, bytes) else 'the bytes given'}: {e}") from e
    return image
