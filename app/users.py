"""The arbiter's users: each a name and a role (`operator`, `user`, `observer`), and a
bearer token per user in `STATE/tokens/NAME` (0600, in a 0700 directory), made at the
first start and kept; a revocation (`NAME.revoked`) outlives restarts."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

from oddl.controller.base.access import read_secret

Role = Literal["operator", "user", "observer"]
ROLES: tuple[str, ...] = get_args(Role)


@dataclass(frozen=True)
class User:
    name: str
    role: Role


MIN_TOKEN = 22  # characters of a token: 22 of base64's 64 are 132 bits


def new_token(f: Path) -> str:
    """A fresh token (256 random bits) in `f` (0600), in place of any there: written beside
    it and renamed, so a reader never sees half of one."""
    token = secrets.token_urlsafe(32)
    tmp = f.with_name(f".{f.name}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, f)
    return token


def revoked(token_file: Path) -> bool:
    """Whether an operator revoked this user's token (`oddl token USER --revoke`): the mark
    beside it, kept until the token is rotated, so that no start of the arbiter mints one."""
    return token_file.with_name(token_file.name + ".revoked").exists()


def roles_of(users: list[str]) -> dict[str, Role]:
    """name -> role, for `--user NAME[:ROLE]` (role default `user`): every user, whether
    or not they hold a token (one revoked holds none)."""
    out: dict[str, Role] = {}
    for spec in users:
        name, _, role = spec.partition(":")
        role = role or "user"
        if role not in ROLES:
            raise ValueError(f"--user {spec}: role {role!r} is not one of {', '.join(ROLES)}")
        if not name.isidentifier():
            raise ValueError(f"--user {spec}: a user name is letters, digits and _")
        if name in out:
            raise ValueError(f"--user {spec}: {name} is named twice")
        out[name] = cast(Role, role)  # one of ROLES: checked above
    return out


def tokens(state: Path, users: list[str]) -> dict[str, User]:
    """token -> user, for `--user NAME[:ROLE]` (role default `user`): a token per user in
    `state/tokens/NAME` (0600, in a 0700 directory), made at the first start and kept, but
    for a user an operator revoked. A token file that is no token (unreadable, under 128
    bits) or one that two users share is refused, naming it: the arbiter does not start."""
    d = state / "tokens"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    out: dict[str, User] = {}
    for name, role in roles_of(users).items():
        f = d / name
        if revoked(f):  # an operator's revocation outlives the arbiter: no new token
            continue
        if not f.exists():
            new_token(f)
        try:
            token = read_secret(f)
        except OSError as e:
            raise ValueError(f"{f}: {e}") from None
        if len(token) < MIN_TOKEN or any(c.isspace() for c in token):
            raise ValueError(f"{f}: a token of at least {MIN_TOKEN} characters and no spaces "
                             f"(128 random bits; delete the file for a new one)")
        if token in out:
            raise ValueError(f"{f}: the same token as {out[token].name}'s: each user needs "
                             f"their own (delete one file for a new one)")
        out[token] = User(name, role)
    return out
