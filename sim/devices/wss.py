"""A wavelength-selective switch model: a routing table per (input port, channel).

Like an LCoS WSS it is configured slowly and as a whole, and it refuses a table that would
send two inputs to the same (output port, channel): those signals would collide.
"""

from __future__ import annotations

from collections.abc import Mapping

from oddl.controller.base.devices import DeviceRefused


class WSSModel:
    def __init__(self, id: str, ports: int, channels: int, reconfig_ns: int = 5_000_000) -> None:
        self.id = id
        self.ports = ports
        self.channels = channels
        self.reconfig_ns = reconfig_ns  # LCoS settling time: stage 1 only (milliseconds)
        self.table: list[list[int | None]] = [[None] * channels for _ in range(ports)]
        self.applied = 0
        self.changes = [0] * ports  # per input: applies that changed its row (its light)
        self.misroute: dict[tuple[int, int], int] = {}  # fault: (in, ch) -> actual out
        self.dead = False  # fault: it answers nothing and passes no light

    def _alive(self) -> None:
        if self.dead:
            raise TimeoutError(f"{self.id}: no answer")

    def identify(self) -> str:
        self._alive()
        return f"oddl-emu,WSS,{self.id},{self.ports}x{self.channels}"

    def check(self, table: list[list[int | None]]) -> None:
        if len(table) != self.ports:
            raise DeviceRefused(f"{self.id}: table has {len(table)} input rows, WSS has "
                                f"{self.ports} ports")
        for ch in range(max((len(r) for r in table), default=0)):
            if ch >= self.channels:
                raise DeviceRefused(f"{self.id}: channel {ch} not available "
                                    f"({self.channels} channels)")
            seen: dict[int, int] = {}
            for i, row in enumerate(table):
                o = row[ch] if ch < len(row) else None
                if o is None:
                    continue
                if not 0 <= o < self.ports:
                    raise DeviceRefused(f"{self.id}: input {i} channel {ch}: no output port {o}")
                if o in seen:
                    raise DeviceRefused(f"{self.id}: inputs {seen[o]} and {i} both reach "
                                        f"(out {o}, channel {ch}): collision, table refused")
                seen[o] = i

    def set_table(self, table: list[list[int | None]]) -> None:
        self._alive()
        self.check(table)
        new = [[r[ch] if ch < len(r) else None for ch in range(self.channels)] for r in table]
        for i, (old, row) in enumerate(zip(self.table, new, strict=True)):
            self.changes[i] += old != row
        self.table = new
        self.applied += 1

    def set_rows(self, rows: Mapping[int, list[int | None]]) -> None:
        """The LCoS steers each input's light on its own pixels: the inputs not named keep
        theirs. The result is checked as a whole table is."""
        self._alive()
        bad = [i for i in rows if not 0 <= i < self.ports]
        if bad:
            raise DeviceRefused(f"{self.id}: no input port {bad[0]} ({self.ports} ports)")
        self.set_table([list(rows.get(i, r)) for i, r in enumerate(self.table)])

    def get_table(self) -> list[list[int | None]]:
        self._alive()
        return [list(r) for r in self.table]

    def route(self, in_port: int, channel: int) -> int | None:
        if self.misroute:
            bad = self.misroute.get((in_port, channel))
            if bad is not None:
                return bad  # a faulty LCoS: the table reads back right, the light goes here
        row = self.table[in_port]
        return row[channel] if channel < len(row) else None
