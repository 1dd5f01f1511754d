"""What every config shares: issues (file, field, reason) and the error that carries
them, the models' base, reading a file (bounded, UTF-8, TOML), pydantic's errors in our
words, the bounds on a config's sizes."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

C_NM = 299_792.458  # speed of light in nm * THz


BAND_NM = (1530.0, 1625.0)  # optical C band (1530-1565) and L band (1565-1625)


@dataclass(frozen=True)
class ConfigIssue:
    file: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.reason}" if self.path else \
            f"{self.file}: {self.reason}"


class ConfigError(Exception):
    """A config file that cannot be used; carries every issue found."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


MAX_NODES = 65_536  # the job topics' bound (controller/stage2/job.py): 256 x 256


# a ring's flows grow as n^2: 2 M at 1,024 ranks (SiP-ML's ring, jocn-1024-vgg19) runs in
# half a minute; 4,096 ranks' 33 M took check 110 s and 8 GB (issue 33)
MAX_FLOWS_PER_ITERATION = 4_000_000


MAX_FILE_BYTES = 16 << 20  # a grid-4096 testbed written out is ~1 MB


def fmt_loc(loc: tuple[Any, ...]) -> str:
    s = ""
    for part in loc:
        if isinstance(part, int):
            s += f"[{part}]"
        else:
            s += ("." if s else "") + str(part)
    return s


def read_text(path: Path) -> str:
    """A config file's text, or a ConfigError naming the file and why (missing, not a
    regular file, too big, not UTF-8)."""
    def fail(why: str) -> ConfigError:
        return ConfigError([ConfigIssue(str(path), "", why)])

    try:
        if not path.is_file():  # a directory, /dev/zero, a FIFO: never read it
            raise fail("file not found" if not path.exists() else "not a regular file")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise fail(f"{path.stat().st_size} bytes: a config is at most {MAX_FILE_BYTES}")
        with path.open("rb") as f:
            return f.read(MAX_FILE_BYTES + 1).decode("utf-8")
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    except UnicodeDecodeError as e:
        raise fail(f"not UTF-8 text (byte {e.start}): {e.reason}") from None


MAX_KEY_BYTES = 1024


def read_key(path: Path) -> bytes:
    """The key a key file holds (16 to 1,024 bytes, surrounding whitespace stripped: a
    Pyro HMAC key, a cassette's signing key); ValueError naming the file and why."""
    try:
        with path.open("rb") as f:
            key = f.read(MAX_KEY_BYTES + 1).strip()
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    if not 16 <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"{path}: a key is 16 to {MAX_KEY_BYTES} bytes")
    return key


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's data, or a ConfigError naming the file and why (`read_text`'s
    reasons, not TOML, a number too long to convert, nested too deep)."""
    return parse_toml(read_text(path), str(path))


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML text's data, or a ConfigError naming its `source` and why."""
    def fail(why: str) -> ConfigError:
        return ConfigError([ConfigIssue(source, "", why)])

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise fail(f"not valid TOML: {e}") from None
    except RecursionError:
        raise fail("not a usable TOML document: nested too deep") from None
    except ValueError as e:  # e.g. an integer literal over Python's 4300-digit limit
        raise fail(f"not a usable TOML value: {e}") from None


def is_experiment(data: dict[str, Any]) -> bool:
    return "workload" in data or "jobs" in data or "jobs_trace" in data


def field_issues(e: ValidationError) -> list[tuple[str, str]]:
    """(field path, reason) of each of a validation's errors, in our words: no "Value
    error, " prefix, no link to pydantic's pages."""
    return [(fmt_loc(err["loc"]), re.sub(r"^(Value error|Assertion failed), ", "",
                                          err["msg"])) for err in e.errors()]


def pydantic_issues(path: Path, e: ValidationError) -> list[ConfigIssue]:
    return [ConfigIssue(str(path), f, why) for f, why in field_issues(e)]
