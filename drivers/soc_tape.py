"""A QICK board on a cassette (drivers/cassette.py): every call the drivers make on its
soc, recorded with its answer, and replayed with no board, no Pyro name server and no
emulated soc.

The boundary is the soc object, where a lab's `qick.pyro.make_proxy` proxy, a `QickSoc`
on the board and the emulated soc meet the drivers (drivers/lightning.py, lightning_mac.py,
through qick's `AveragerProgram`): each method call is a `call` event (its name, its
arguments) and its answer a `ret` event (the value, or the error it raised, by type name
and words). Values cross as JSON (drivers/soc_values.py). The board's
configuration (`get_cfg`) is its first call, so a replay builds its `QickConfig` from the
recorded one, which must be a dict (qick would open a file it names).
"""

from __future__ import annotations

from typing import Any

from oddl.drivers import cassette
from oddl.drivers.soc_values import decode, encode

DEV = "qick"


class SocError(RuntimeError):
    """An error the board raised when it was recorded, raised again by the replay."""


class TapedSoc:
    """The soc as the drivers reach it while a cassette records: each method's call and
    answer onto the cassette; attributes that are data pass through."""

    def __init__(self, soc: Any, rec: cassette.Recorder) -> None:
        self._soc, self._rec = soc, rec

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._soc, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._rec.event(DEV, "call", m=name, a=encode([list(args), kwargs]))
            try:
                out = attr(*args, **kwargs)
            except Exception as e:
                self._rec.event(DEV, "ret", e=f"{type(e).__name__}: {e}")
                raise
            self._rec.event(DEV, "ret", v=encode(out))
            return out
        return call


class PlayedSoc:
    """The soc as a replay serves it: each call must be the one recorded, and gets the
    recorded answer."""

    def __init__(self, player: cassette.Player) -> None:
        self._p = player

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._p.take(DEV, "call", m=name, a=encode([list(args), kwargs]))
            ret = self._p.take(DEV, "ret")
            if isinstance(ret.get("e"), str):
                raise SocError(ret["e"])
            return decode(ret.get("v"))
        return call


def opened(open_: Any) -> tuple[Any, Any]:
    """(soc, soccfg) of `open_()` as the drivers use them: recorded onto the cassette
    being written, or served from the one being played (then nothing is opened)."""
    from qick.qick_asm import QickConfig

    def play(player: cassette.Player) -> tuple[Any, Any]:
        soc = PlayedSoc(player)
        cfg = soc.get_cfg()
        if not isinstance(cfg, dict):
            raise cassette.CassetteError("the QICK board's recorded configuration is no "
                                         "dict")
        return soc, QickConfig(cfg)

    def record() -> tuple[Any, Any]:
        soc, soccfg = open_()
        if isinstance(cassette.active, cassette.Recorder):
            soc = TapedSoc(soc, cassette.active)
            soc.get_cfg()  # (the replay's QickConfig is made of it)
        return soc, soccfg

    return cassette.opened(DEV, record, play)
