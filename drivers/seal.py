"""A cassette's signature: HMAC-SHA256, under a key only its owner holds, over every line
it holds (header, each event, footer), written as its last line.

The per-device digest chain (`cassette._chain`) names the first event changed after
recording, but anyone can compute it again: an edited cassette with its chain recomputed
replayed as "the same result as recorded". A signature cannot be recomputed without the
key (a file `config.fields.read_key` reads). `--record ... --record-key FILE` signs;
`oddl replay --key FILE` checks it (a cassette that is unsigned, or signed otherwise, is
refused), and without a key the replay says whether what it played was signed,
unchecked.
"""

from __future__ import annotations

import hmac
import json

SIGNED = "hmac-sha256"  # the header's "signed"


class Signature:
    """The running HMAC over a cassette's lines, as written or as read."""

    def __init__(self, key: bytes) -> None:
        self._mac = hmac.new(key, digestmod="sha256")

    def add(self, line: str) -> None:
        self._mac.update(line.encode("utf-8"))

    def line(self) -> str:
        """The last line: what every line before it signs to."""
        return json.dumps({"hmac": self._mac.hexdigest()}) + "\n"

    def matches(self, written: object) -> bool:
        return isinstance(written, str) and hmac.compare_digest(self._mac.hexdigest(),
                                                                written)
