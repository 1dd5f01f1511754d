"""The control bus over MQTT (aiomqtt), behind the same `Bus` interface as the sim bus.

Topics (docs/mqtt.md):
    oddl/<testbed>/node/<node>/ctl     REQUEST / GRANT / RELEASE / WAIT to <node>   QoS 0
    oddl/<testbed>/status/<client>     "online" / "offline" (last will), retained    QoS 1
QoS 0 for control messages: the protocol carries its own time-outs, retries and leases,
and QoS 1's at-least-once adds a broker round trip per message without removing the need
for them. Status is QoS 1 and retained, so a late subscriber sees who is alive; the broker
publishes the last will when a client vanishes without disconnecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
from oddl.controller.messages import ControlMessage
from oddl.controller.wire import BusDecodeError, decode, encode

log = logging.getLogger(__name__)

QOS_CTL = 0
# Linux: hold a flush's packets and send them as one segment, waking the broker once
_CORK: int | None = getattr(socket, "TCP_CORK", None)
QOS_STATUS = 1


def ctl_topic(testbed: str, node: str) -> str:
    return f"oddl/{testbed}/node/{node}/ctl"


def status_topic(testbed: str, client: str) -> str:
    return f"oddl/{testbed}/status/{client}"


class BusError(ConnectionError):
    """The control bus could not connect (refused, not authorised, no broker) or broke."""


class MQTTBus:
    """REQUEST/GRANT/RELEASE over MQTT, on paho-mqtt driven by the asyncio loop directly.

    paho's documented external-loop API (socket callbacks, `loop_read`/`loop_write`/
    `loop_misc`), not aiomqtt: aiomqtt (used for the job, status and telemetry clients)
    spends a task and an `asyncio.wait` on every received message and a thread-safe
    callback plus two loop turns on every publish, which doubled the request-to-grant
    round trip (0.60 -> 0.28 ms through Mosquitto, docs/emu-run.md). Here what one loop
    turn publishes leaves as one TCP segment at the end of the turn, and the messages one
    socket read brings are handled in one go. No reconnection: a lost broker is logged,
    the control units' time-outs fail the flows, and the run says which.
    """

    def __init__(self, testbed: str, host: str = "127.0.0.1", port: int = 1883, *,
                 username: str | None = None, password: str | None = None,
                 tls_context: ssl.SSLContext | None = None, client_id: str = "oddl-ctl",
                 tap: Callable[[str, ControlMessage], None] | None = None,
                 keepalive: int = 60, connect_timeout: float = 10.0) -> None:
        self.testbed = testbed
        self.tap = tap  # an observer of every delivered message (the invariant checker)
        self.client_id = client_id
        self.host, self.port = host, port
        self.keepalive, self.connect_timeout = keepalive, connect_timeout
        self.handlers: dict[str, Callable[[ControlMessage], None]] = {}
        self._sent = 0
        self.received = 0
        self.rejected = 0
        self.stalls = 0  # times the socket was full and the rest waited for writability
        self._prefix = f"oddl/{testbed}/node/"
        self._status = status_topic(testbed, client_id)
        self._inbox: list[tuple[str, bytes]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: Any = None
        self._writing = False
        self._flush_due = False
        self._thread = threading.get_ident()
        self._misc: asyncio.Task[None] | None = None
        self._connack: asyncio.Future[Any] | None = None
        self._started = False
        c = self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                      protocol=mqtt.MQTTv311)
        if username is not None:
            c.username_pw_set(username, password)
        if tls_context is not None:
            c.tls_set_context(tls_context)
        c.will_set(self._status, b"offline", qos=QOS_STATUS, retain=True)
        c.on_socket_open = self._on_open
        c.on_socket_close = self._on_close
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        c.on_disconnect = self._on_disconnect
        c.on_socket_register_write = self._on_want_write

    @property
    def sent(self) -> int:
        return self._sent

    def attach(self, node: str, handler: Callable[[ControlMessage], None]) -> None:
        self.handlers[node] = handler

    def send(self, src: str, dst: str, msg: ControlMessage) -> None:
        self._sent += 1
        if not self._started:
            log.warning("mqtt: %s: %s to %s while not connected: dropped", self.client_id,
                        type(msg).__name__, dst)
            return
        self.client.publish(ctl_topic(self.testbed, dst), encode(msg), QOS_CTL)

    # --- connection ----------------------------------------------------------------------
    async def start(self) -> MQTTBus:
        loop = self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._connack = loop.create_future()
        try:  # the TCP (and TLS) handshake blocks: off the loop, as aiomqtt does it
            await asyncio.wait_for(asyncio.to_thread(
                self.client.connect, self.host, self.port, self.keepalive),
                self.connect_timeout)
            rc = await asyncio.wait_for(self._connack, self.connect_timeout)
        except (OSError, ssl.SSLError, TimeoutError) as e:
            self._drop()
            raise BusError(f"mqtt: {self.client_id}: cannot reach the broker at "
                           f"{self.host}:{self.port}: {e!r}") from None
        if rc.is_failure:
            self._drop()
            raise BusError(f"mqtt: {self.client_id}: the broker at {self.host}:{self.port} "
                           f"refused the connection: {rc}")
        self._started = True
        for node in self.handlers:
            self.client.subscribe(ctl_topic(self.testbed, node), qos=QOS_CTL)
        self.client.publish(self._status, b"online", qos=QOS_STATUS, retain=True)
        self._flush()
        self._misc = loop.create_task(self._keepalive())
        return self

    async def close(self, timeout: float = 5.0) -> None:
        """Leave cleanly (status 'offline', DISCONNECT), bounded: a broker that has gone
        away must not hang whoever is shutting down; never started: nothing to do."""
        if not self._started:
            return
        self._started = False
        if self._misc is not None:
            self._misc.cancel()
        try:
            info = self.client.publish(self._status, b"offline", qos=QOS_STATUS, retain=True)
            self._flush()
            deadline = time.monotonic() + timeout
            while not info.is_published() and self._sock is not None:
                if time.monotonic() > deadline:
                    raise TimeoutError("no PUBACK for the status")
                await asyncio.sleep(0.001)
            self.client.disconnect()
            self._flush()
        except (TimeoutError, OSError, RuntimeError) as e:
            log.warning("mqtt: %s left without a clean disconnect: %r", self.client_id, e)
        self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            self._on_close(self.client, None, self._sock)
        with contextlib.suppress(OSError):
            sock = self.client.socket()
            if sock is not None:
                sock.close()

    async def _keepalive(self) -> None:
        while self.client.loop_misc() == mqtt.MQTT_ERR_SUCCESS:
            self._flush()
            await asyncio.sleep(1)
        log.warning("mqtt: %s: connection to the broker lost", self.client_id)

    # --- paho's socket callbacks (connect runs in a worker thread: hop to the loop) -------
    def _on_open(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._watch, sock)

    def _watch(self, sock: Any) -> None:
        self._sock = sock
        assert self._loop is not None
        self._loop.add_reader(sock, self._readable)
        self._flush()  # CONNECT may still be waiting

    def _on_close(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        if self._loop is not None and self._sock is sock:
            self._loop.remove_reader(sock)
            if self._writing:
                self._loop.remove_writer(sock)
                self._writing = False
            self._sock = None

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: Any,
                    props: Any = None) -> None:
        if self._connack is not None and not self._connack.done():
            self._connack.set_result(rc)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: Any,
                       props: Any = None) -> None:
        if self._started:  # not our own DISCONNECT: the protocol's retries take over
            log.warning("mqtt: %s: disconnected from the broker: %s", self.client_id, rc)

    def _on_message(self, client: mqtt.Client, userdata: Any, m: mqtt.MQTTMessage) -> None:
        self._inbox.append((m.topic, m.payload))  # handled once paho is out of its read

    def _on_want_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        """paho has a packet to write: write it at the end of this loop turn, together
        with whatever else this turn sends (one wake-up of the broker, not one each)."""
        if self._flush_due or self._writing or self._loop is None:
            return
        self._flush_due = True
        if threading.get_ident() == self._thread:
            self._loop.call_soon(self._flush)
        else:  # connect() runs in a worker thread
            self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        """Write what paho has queued now; if the socket is full, finish when writable."""
        self._flush_due = False
        c = self.client
        if self._sock is None or not c.want_write():
            return
        sock = self._sock
        if _CORK is not None:  # paho sends packet by packet: leave as one segment
            sock.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
        try:
            c.loop_write()
        finally:
            if _CORK is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, _CORK, 0)
        if self._sock is None:
            return
        want = c.want_write()
        assert self._loop is not None
        if want and not self._writing:
            self.stalls += 1
            self._loop.add_writer(self._sock, self._flush)
            self._writing = True
        elif not want and self._writing:
            self._loop.remove_writer(self._sock)
            self._writing = False

    def _readable(self) -> None:
        c = self.client
        for _ in range(64):  # all the packets this wake-up brought, bounded
            before = len(self._inbox)
            if c.loop_read() != mqtt.MQTT_ERR_SUCCESS or self._sock is None:
                break
            if len(self._inbox) == before:
                break
        inbox, self._inbox = self._inbox, []
        for topic, payload in inbox:
            self._deliver(topic, payload)
        sock = self._sock
        if sock is not None and getattr(sock, "pending", None) is not None and sock.pending():
            assert self._loop is not None  # TLS: decrypted bytes the selector cannot see
            self._loop.call_soon(self._readable)

    def _deliver(self, topic: str, payload: bytes) -> None:
        prefix = self._prefix
        node = topic[len(prefix):-len("/ctl")] if topic.startswith(prefix) else ""
        handler = self.handlers.get(node)
        if handler is None:
            self.rejected += 1
            log.warning("mqtt: message on %s for no attached node dropped", topic)
            return
        try:
            msg = decode(payload)
        except BusDecodeError as e:
            self.rejected += 1
            log.warning("mqtt: %s: rejected message: %s", topic, e)
            return
        if msg.dst != node:
            self.rejected += 1
            log.warning("mqtt: %s: message addressed to %s dropped", topic, msg.dst)
            return
        self.received += 1
        try:
            if self.tap is not None:
                self.tap(node, msg)
            handler(msg)
        except Exception:  # a control unit's bug must not take the bus down
            log.exception("mqtt: handler for %s failed on %r", node, msg)


async def request_grant_rtt(bus: Any, n: int, warmup: int = 20, timeout_s: float = 60.0,
                            a: str = "n0", b: str = "n1") -> list[float]:
    """REQUEST a -> b, b GRANTs at once, through the bus's broker: n round trips (seconds),
    after `warmup` discarded ones. `bus` is an MQTTBus not yet started."""
    from oddl.controller.messages import Grant, Request

    sent: dict[int, float] = {}
    samples: list[float] = []
    done = asyncio.Event()

    def on_b(m: Any) -> None:
        bus.send(b, a, Grant(m.flow, 0, b, a, "H", 0, 0))

    def on_a(m: Any) -> None:
        samples.append(time.perf_counter() - sent[m.flow])
        if len(samples) == n + warmup:
            done.set()
        else:
            ask(len(samples))

    def ask(i: int) -> None:
        sent[i] = time.perf_counter()
        bus.send(a, b, Request(i, 0, a, b, "H", 0, 64))

    bus.attach(a, on_a)
    bus.attach(b, on_b)
    await bus.start()
    try:
        ask(0)
        await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        await bus.close()
    return samples[warmup:]


def broker_params(broker: Any, port: int | None = None) -> dict[str, Any]:
    """Connection parameters for a testbed's `[broker]` (an embedded broker's port given)."""
    import os

    if broker.url == "embedded":
        if port is None:
            raise ValueError("the embedded broker's port is known only once it runs")
        return {"host": broker.bind, "port": port}
    scheme, host, bport = broker.endpoint()
    password = None
    if broker.password_env:
        password = os.environ.get(broker.password_env)
        if password is None:
            raise ValueError(f"broker password: environment variable {broker.password_env} "
                             f"is not set")
    tls = ssl.create_default_context(cafile=broker.ca_file) if scheme == "mqtts" else None
    return {"host": host, "port": bport, "username": broker.username, "password": password,
            "tls_context": tls}


def bus_from_config(testbed: str, broker: Any, port: int | None = None,
                    tap: Callable[[str, ControlMessage], None] | None = None,
                    client_id: str | None = None) -> MQTTBus:
    """An MQTTBus for a testbed's `[broker]`."""
    return MQTTBus(testbed, **broker_params(broker, port),
                   client_id=client_id or broker.client_id, tap=tap)


def client_from_config(broker: Any, client_id: str, port: int | None = None) -> aiomqtt.Client:
    """A plain aiomqtt client on the same broker (job and telemetry topics)."""
    p = broker_params(broker, port)
    return aiomqtt.Client(p.pop("host"), p.pop("port"), identifier=client_id,
                          socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)], **p)
