"""The O-NIC register map: one source of truth, as data.

One AXI-Lite IP (`onic_ctrl`, 64 KiB) holds every register; each field has an access kind:
RO (read only; writes refused), RW, W1C (write 1 to clear), SC (self-clearing: reads 0,
a written 1 triggers the action). The emulated board, the driver and the generated
markdown table (docs/regmap.md) all read this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Access = Literal["RO", "RW", "W1C", "SC"]

IP_NAME = "onic_ctrl"
IP_BASE = 0xA000_0000  # on M_AXI_HPM0_FPD of a Zynq UltraScale+ PS
IP_RANGE = 0x10000
MAGIC = 0x0DD1_0A1C
DESIGN_VERSION = (0 << 16) | 1  # major.minor = 0.1
DESIGN_NAME = "oddl-onic-0.1"
PORTS = ("H", "V")
N_CHANNELS = 64
N_MODULES = 16
N_SLOTS = 8  # counter sources and actions per count-action module
ROUTE_ENTRIES = 1024
CA_FIRE_LIMIT = 64  # count-action firings after one datapath event; beyond: ERROR.CA_LOOP


@dataclass(frozen=True)
class Reg:
    name: str
    offset: int
    access: Access
    doc: str
    reset: int = 0


HEADER = ("flow id, high word", "original source node", "hop (bits 0-7) | step << 8",
          "iteration", "submit time ns, low word", "submit time ns, high word")


def _port_regs(p: str, base: int) -> list[Reg]:
    # DST, BYTES, FLOW and the header words are contiguous: a driver loads a transfer with
    # one block write, then writes START
    return [
        Reg(f"TX{p}_CHANNEL", base + 0x00, "RW", f"port {p}: wavelength channel to tune to"),
        Reg(f"TX{p}_CMD", base + 0x04, "SC", "bit0 TUNE: start tuning to TX_CHANNEL; bit1 "
            "THEN_START (with TUNE): start the loaded transfer the moment the channel locks"),
        Reg(f"TX{p}_STATUS", base + 0x08, "RO",
            "bit0 TUNING, bit1 SENDING, bit2 TUNED (a channel is locked); bits 8-15 channel"),
        Reg(f"TX{p}_DST", base + 0x0C, "RW",
            "transfer engine: final destination node index (carried in the header)"),
        Reg(f"TX{p}_BYTES", base + 0x10, "RW", "transfer engine: byte count"),
        Reg(f"TX{p}_FLOW", base + 0x14, "RW", "transfer engine: flow id (low 32 bits)"),
        *[Reg(f"TX{p}_HDR{i}", base + 0x18 + 4 * i, "RW", f"header word {i} sent with the "
              f"transfer: {HEADER[i]}") for i in range(len(HEADER))],
        Reg(f"TX{p}_START", base + 0x30, "SC",
            "bit0 START; refused (ERROR bit TX_REFUSED) while tuning or sending"),
        Reg(f"TX{p}_DONE_COUNT", base + 0x34, "RO", "transfers completed"),
        Reg(f"TX{p}_SENT_LO", base + 0x38, "RO", "bytes sent, low word"),
        Reg(f"TX{p}_SENT_HI", base + 0x3C, "RO", "bytes sent, high word"),
        Reg(f"TX{p}_TUNE_NS", base + 0x40, "RO", "duration of the last tuning, ns"),
        Reg(f"RX{p}_STATUS", base + 0x50, "RO", "bit0 BUSY (receiving)"),
        Reg(f"RX{p}_SRC", base + 0x54, "RO", "node the last transfer came from (this leg)"),
        Reg(f"RX{p}_BYTES_LO", base + 0x58, "RO", "bytes received, low word"),
        Reg(f"RX{p}_BYTES_HI", base + 0x5C, "RO", "bytes received, high word"),
        Reg(f"RX{p}_ERRORS", base + 0x60, "W1C", "receive error count (CRC); write 1s to clear"),
        Reg(f"RX{p}_LAST_FLOW", base + 0x64, "RO", "flow id of the last completed transfer"),
        Reg(f"RX{p}_LAST_BYTES", base + 0x68, "RO", "byte count of the last received transfer"),
        Reg(f"RX{p}_DONE_COUNT", base + 0x6C, "RO", "transfers received"),
        Reg(f"RX{p}_CUR_FLOW", base + 0x70, "RO",
            "flow id (low 32 bits) of the transfer being received; 0xFFFFFFFF when idle",
            0xFFFFFFFF),
        Reg(f"RX{p}_DST", base + 0x74, "RO", "final destination of the last received transfer"),
        *[Reg(f"RX{p}_HDR{i}", base + 0x78 + 4 * i, "RO", f"header word {i} of the last "
              f"received transfer") for i in range(len(HEADER))],
    ]


def _ca_regs() -> list[Reg]:
    out = []
    for m in range(N_MODULES):
        b = CA_BASE + m * CA_STRIDE
        out += [
            Reg(f"CA{m}_CTRL", b + 0x00, "RW", "bit0 ARM, bit1 AUTO_REARM"),
            Reg(f"CA{m}_RESET", b + 0x04, "SC", "bit0: clear COUNT and FIRED"),
            Reg(f"CA{m}_STATUS", b + 0x08, "RO",
                "bit0 ARMED, bit1 FIRED (sticky until reset); bits 8-15 fire count"),
            Reg(f"CA{m}_TARGET", b + 0x0C, "RW", "fire when COUNT reaches TARGET"),
            Reg(f"CA{m}_COUNT", b + 0x10, "RO", "the running count"),
        ]
        out += [Reg(f"CA{m}_SRC{k}", b + 0x20 + 4 * k, "RW",
                    "source: bits 0-7 signal, 8-15 index, 16-31 filter (node + 1; 0 any)")
                for k in range(N_SLOTS)]
        out += [Reg(f"CA{m}_ACT{k}", b + 0x40 + 4 * k, "RW",
                    "action: bits 0-7 action, 8-15 index, 16-31 argument")
                for k in range(N_SLOTS)]
    return out


PORT_BASE = {"H": 0x100, "V": 0x200}
ROUTE_BASE = 0x1000  # entry e: word0 at +8e = dst node | VALID<<31; word1 = see below
CA_BASE = 0x4000
CA_STRIDE = 0x80

IRQ_BITS = {"TX_DONE_H": 0, "TX_DONE_V": 1, "RX_DONE_H": 2, "RX_DONE_V": 3,
            "TUNED_H": 4, "TUNED_V": 5, "CA_FIRED": 6, "ERROR": 7}
IRQ_MODULE_SHIFT = 16  # IRQ_STATUS bit 16 + m: count-action module m fired
ERROR_BITS = {"TX_REFUSED_H": 0, "TX_REFUSED_V": 1, "ROUTE_MISS": 2, "BAD_CHANNEL": 3,
              "CA_LOOP": 4}  # CA_LOOP: a count-action chain passed its firing limit; cut

REGISTERS: list[Reg] = [
    Reg("MAGIC", 0x000, "RO", "identifies an oddl O-NIC", MAGIC),
    Reg("DESIGN_VERSION", 0x004, "RO", "major << 16 | minor", DESIGN_VERSION),
    *[Reg(f"BITSTREAM_HASH{i}", 0x008 + 4 * i, "RO",
          f"SHA-256 of the bitstream, word {i} (word 0 most significant)") for i in range(8)],
    Reg("NODE_ID", 0x028, "RW", "this node's index in the testbed"),
    Reg("CAPS", 0x02C, "RO", "bits 0-7 ports, 8-15 channels, 16-23 CA modules",
        len(PORTS) | (N_CHANNELS << 8) | (N_MODULES << 16)),
    Reg("IRQ_STATUS", 0x040, "W1C", "event flags: " + ", ".join(
        f"bit{b} {n}" for n, b in IRQ_BITS.items())
        + f"; bits {IRQ_MODULE_SHIFT}-{IRQ_MODULE_SHIFT + N_MODULES - 1}: count-action module m "
          "fired (one read and one clear cover every event)"),
    Reg("IRQ_ENABLE", 0x044, "RW", "interrupt enables, same bits as IRQ_STATUS"),
    Reg("ERROR", 0x048, "W1C", "error flags: " + ", ".join(
        f"bit{b} {n}" for n, b in ERROR_BITS.items())),
    Reg("TS_LO", 0x050, "RO", "free-running ns timestamp, low word (reading it latches TS_HI)"),
    Reg("TS_HI", 0x054, "RO", "timestamp high word, as latched by the last TS_LO read"),
    *_port_regs("H", PORT_BASE["H"]),
    *_port_regs("V", PORT_BASE["V"]),
    *_ca_regs(),
]
BY_NAME = {r.name: r for r in REGISTERS}
BY_OFFSET = {r.offset: r for r in REGISTERS}

# route word 1: next hop node (bits 0-15), channel (16-23), port (bit 24: 0 H, 1 V), VALID (31)
ROUTE_VALID = 1 << 31


def route_words(dst: int, port: str, channel: int, next_hop: int) -> tuple[int, int]:
    return dst | ROUTE_VALID, next_hop | (channel << 16) | (PORTS.index(port) << 24) | ROUTE_VALID


def route_unpack(w0: int, w1: int) -> tuple[int, str, int, int] | None:
    if not (w0 & ROUTE_VALID and w1 & ROUTE_VALID):
        return None
    return w0 & 0xFFFF, PORTS[(w1 >> 24) & 1], (w1 >> 16) & 0xFF, w1 & 0xFFFF


def ca(slot: int, field: str) -> int:
    """The offset of count-action module `slot`'s register `field` (CTRL, TARGET, SRC0...)."""
    return BY_NAME[f"CA{slot}_{field}"].offset


def header_words(flow_id: int, src: int, hop: int, step: int, iteration: int,
                 t_submit: int) -> tuple[int, ...]:
    """A transfer's header (HEADER order), as the TX registers take it and RX ones show it."""
    return ((flow_id >> 32) & 0xFFFFFFFF, src, hop | step << 8, iteration & 0xFFFFFFFF,
            t_submit & 0xFFFFFFFF, (t_submit >> 32) & 0xFFFFFFFF)


def header_unpack(flow_lo: int, words: Sequence[int]) -> tuple[int, int, int, int, int, int]:
    """(flow id, src, hop, step, iteration, t_submit) from the low flow word and a header."""
    hi, src, hs, it, t_lo, t_hi = words
    return hi << 32 | flow_lo, src, hs & 0xFF, hs >> 8, it, t_hi << 32 | t_lo


def markdown() -> str:
    lines = [
        "# O-NIC register map",
        "",
        f"Generated from `fpga/regmap.py` (`oddl regmap`). IP `{IP_NAME}`, range "
        f"0x{IP_RANGE:X}, design {DESIGN_NAME} (version 0x{DESIGN_VERSION:08X}), "
        f"magic 0x{MAGIC:08X}.",
        "",
        "Access: RO read only (a write is refused and flagged), RW read/write, W1C write 1 to "
        "clear, SC self-clearing (reads 0; writing 1 triggers).",
        "",
        f"Route table: {ROUTE_ENTRIES} entries of two words at 0x{ROUTE_BASE:04X} + 8e: word 0 "
        "= destination node | VALID<<31; word 1 = next hop (bits 0-15) | channel (16-23) | "
        "port (bit 24, 0 = H, 1 = V) | VALID<<31.",
        "",
        "| offset | name | access | reset | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    shown_ca = False
    for r in REGISTERS:
        if r.name.startswith("CA") and not r.name.startswith("CA0_"):
            if not shown_ca:
                lines.append(f"| 0x{CA_BASE:04X} + 0x{CA_STRIDE:X}·m | CA*m*_... | | | modules "
                             f"1-{N_MODULES - 1}: same layout as CA0 |")
                shown_ca = True
            continue
        doc = r.doc.replace("|", "\\|")
        lines.append(f"| 0x{r.offset:04X} | {r.name} | {r.access} | 0x{r.reset:X} | {doc} |")
    return "\n".join(lines) + "\n"
