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
            "TUNED_H": 4, "TUNED_V": 5, "CA_FIRED": 6, "ERROR": 7,
            # the stage-2 control unit's (`onic_top` only): a flow delivered here, one failed
            "CU_DELIVERED": 8, "CU_FAILED": 9}
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
# --- the stage-2 control unit's block (`onic_top`, design 0.2: onic_ctrl and ctrl_unit in
# one IP; an `onic_ctrl` alone answers none of it). The host loads the timing and the
# routes, hands over its schedule's flows and reads back deliveries, a failure and the
# unit's counters; the unit itself speaks to its peers in frames on the MAC's stream.
TOP_IP_NAME = "onic_top"
# 0.3: the control unit in the datapath, and the count-action engine's starts its flows
# (0.2: the engine started the port itself)
TOP_DESIGN_VERSION = (0 << 16) | 3
CU_BASE = 0x8000
CU_FLOW_WORDS = 9  # a flow (ctrl_unit's flow_layout: 280 bits) in 32-bit words, LSB first
CU_QUEUE = 16  # flows waiting to be handed to the unit, and deliveries waiting to be read
CU_STATS = ("requests", "retries", "polls", "grants", "revoked", "waits", "stale_grants",
            "relayed", "releases_overdue", "unexpected_rx", "requests_refused", "stray",
            "late", "bad_frames")  # ctrl_unit's counters, in its order
CU_FAIL_CODES = {"no_route": 1, "retries": 2, "short": 3, "queue_full": 4}


def _cu_regs() -> list[Reg]:
    b = CU_BASE
    timing = ("TUNING_NS", "PROPAGATION_NS", "REQUEST_TIMEOUT_NS", "RELEASE_TIMEOUT_NS",
              "LEASE_NS")
    return [
        Reg("CU_CAPS", b + 0x00, "RO", "bits 0-7 flows a port queues, 8-15 REQUESTs a port "
            "waits, 16-23 delivered keys a port remembers, 24-31 REQUESTs waiting from one "
            "sender (the build's bounds)"),
        Reg("CU_NODES", b + 0x04, "RO", "route entries (the highest node index + 1)"),
        Reg("CU_CTRL", b + 0x08, "RW", "bit0 HALT: the unit drops everything and answers "
            "nothing (out of reset, and between jobs)", 1),
        Reg("CU_TAG", b + 0x0C, "RW", "the job's tag (a flow id's bits 40-55): a message of "
            "another tag is late, not stray"),
        *[Reg(f"CU_{t}", b + 0x10 + 4 * i, "RW", f"timing: {t.lower().replace('_', ' ')}")
          for i, t in enumerate(timing)],
        Reg("CU_MAX_RETRIES", b + 0x24, "RW", "REQUEST retries before a flow fails"),
        Reg("CU_ROUTE_DST", b + 0x28, "RW", "the node whose route CU_ROUTE writes"),
        Reg("CU_ROUTE", b + 0x2C, "SC", "a write stores the route of node CU_ROUTE_DST: next "
            "hop (bits 0-15) | channel (16-23) | port (bit 24, 0 = H) | VALID<<31"),
        *[Reg(f"CU_SUBMIT{k}", b + 0x40 + 4 * k, "RW", f"a flow to hand over, word {k}")
          for k in range(CU_FLOW_WORDS)],
        Reg("CU_SUBMIT_GO", b + 0x64, "SC", "bit0: queue CU_SUBMIT0-8 as a flow for the unit"),
        Reg("CU_SUBMIT_FREE", b + 0x68, "RO", "flows the submit queue can still take"),
        *[Reg(f"CU_DELIV{k}", b + 0x80 + 4 * k, "RO", f"the oldest delivered flow, word {k}")
          for k in range(CU_FLOW_WORDS)],
        Reg("CU_DELIV_COUNT", b + 0xA4, "RO", "delivered flows waiting to be read"),
        Reg("CU_DELIV_POP", b + 0xA8, "SC", "bit0: drop the oldest delivered flow"),
        Reg("CU_DELIV_LOST", b + 0xAC, "RO", "deliveries dropped: the queue was full"),
        Reg("CU_FAIL", b + 0xB0, "W1C", "the first failure's code (" + ", ".join(
            f"{v} {k}" for k, v in CU_FAIL_CODES.items()) + "); write 1s to clear"),
        Reg("CU_FAIL_FLOW_LO", b + 0xB4, "RO", "its flow id, low word"),
        Reg("CU_FAIL_FLOW_HI", b + 0xB8, "RO", "its flow id, high word"),
        Reg("CU_FAIL_PEER", b + 0xBC, "RO", "the peer that never answered (retries)"),
        Reg("CU_FAIL_BYTES", b + 0xC0, "RO", "the bytes that arrived (short), low word"),
        *[Reg(f"CU_STAT_{k.upper()}", b + 0x100 + 4 * i, "RO", f"counter: {k}")
          for i, k in enumerate(CU_STATS)],
        Reg("CU_SENT", b + 0x180, "RO", "control frames the unit has sent"),
        *[Reg(f"CU_UNEXPECTED_{p}", b + 0x184 + 4 * i, "RO", f"transfers port {p} received "
              "that it never granted") for i, p in enumerate(PORTS)],
    ]


CU_REGISTERS: list[Reg] = _cu_regs()
BY_NAME = {r.name: r for r in [*REGISTERS, *CU_REGISTERS]}
BY_OFFSET = {r.offset: r for r in REGISTERS}
CU_BY_OFFSET = {r.offset: r for r in CU_REGISTERS}

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
    lines += ["", f"## The control unit's block (`{TOP_IP_NAME}`, design version "
                  f"0x{TOP_DESIGN_VERSION:08X})", "",
              f"`{TOP_IP_NAME}` is `{IP_NAME}` with the stage-2 control unit in its datapath, "
              f"behind this block at 0x{CU_BASE:04X} (an `{IP_NAME}` alone has none of it). A "
              f"flow is {CU_FLOW_WORDS} words, least significant first, in `ctrl_unit`'s "
              "flow layout: id (64 bits), src, dst (16 each, node indices), bytes (48), "
              "iteration, step (32 each), hop (8), submit time ns (64).", "",
              "| offset | name | access | reset | description |",
              "| --- | --- | --- | --- | --- |"]
    for r in CU_REGISTERS:
        doc = r.doc.replace("|", "\\|")
        lines.append(f"| 0x{r.offset:04X} | {r.name} | {r.access} | 0x{r.reset:X} | {doc} |")
    return "\n".join(lines) + "\n"
