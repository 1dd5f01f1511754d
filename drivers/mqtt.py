"""The control bus over MQTT (paho on the asyncio loop), behind the same `Bus` interface as
the sim bus, plus the raw topics a node program needs on the same connection.

Topics and who may use them: controller/base/access.py and docs/mqtt.md. QoS 0 for control
messages: the protocol carries its own time-outs, retries and leases, and QoS 1's
at-least-once adds a broker round trip per message without removing the need for them.
Status is QoS 1 and retained, so a late subscriber sees who is alive; the broker publishes
the last will when a client vanishes without disconnecting.

One party, one connection: the client id is the party's username, so that a broker that
ties the two (Mosquitto's `use_username_as_clientid`, the embedded broker) lets no one
take another's session over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from oddl.controller.base.access import (
    CONTROLLER,
    check_name,
    ctl_topic,
    read_secret,
    status_topic,
    telemetry_topic,
)
from oddl.controller.base.messages import ControlMessage
from oddl.controller.base.telemetry import RETAINED
from oddl.controller.base.throttle import worth_logging
from oddl.controller.stage2.wire import BusDecodeError, decode, encode
from oddl.drivers import cassette

log = logging.getLogger(__name__)

QOS_CTL = 0
QOS_STATUS = 1
# Linux: hold a flush's packets and send them as one segment, waking the broker once
_CORK: int | None = getattr(socket, "TCP_CORK", None)
MAX_RAW_BYTES = 4 << 20  # job specs and results (a grid-4096 spec is ~1 MB)
RawHandler = Callable[[str, bytes], None]


class BusError(ConnectionError):
    """The control bus could not connect (refused, not authorised, no broker) or broke."""


class MQTTBus:
    """REQUEST/GRANT/RELEASE over MQTT, on paho-mqtt driven by the asyncio loop directly.

    paho's documented external-loop API (socket callbacks, `loop_read`/`loop_write`/
    `loop_misc`), not aiomqtt: aiomqtt spends a task and an `asyncio.wait` on every
    received message and a thread-safe callback plus two loop turns on every publish,
    which doubled the request-to-grant round trip (0.60 -> 0.28 ms through Mosquitto,
    docs/emu-run.md). Here what one loop
    turn publishes leaves as one TCP segment at the end of the turn, and the messages one
    socket read brings are handled in one go. A lost broker sets `lost`; the owner
    (the node program, the controller) makes its devices safe and calls `reconnect`.
    """

    def __init__(self, testbed: str, host: str = "127.0.0.1", port: int = 1883, *,
                 user: str, password: str | None = None,
                 tls_context: ssl.SSLContext | None = None,
                 tap: Callable[[str, ControlMessage], None] | None = None,
                 keepalive: int = 60, connect_timeout: float = 10.0,
                 readonly: bool = False, session: str = "") -> None:
        """readonly: a watcher (the dashboard) that may write nothing, not even a status.
        session: said after its status ("online SESSION", "offline SESSION"), so that a
        party's earlier life is told apart from this one (a controller's: its jobs)."""
        self.testbed = testbed
        self.readonly = readonly
        self.tap = tap  # an observer of every delivered message (the invariant checker)
        self.user = check_name("MQTT party", user)
        self.dev = f"mqtt:{user}"  # its name on a cassette
        self.host, self.port = host, port
        self.keepalive, self.connect_timeout = keepalive, connect_timeout
        self.handlers: dict[str, Callable[[ControlMessage], None]] = {}
        self.raw: dict[str, RawHandler] = {}  # topic filter -> handler (job, status topics)
        self.peers: set[str] | None = None  # senders accepted (None: any)
        self._sent = 0
        self.received = 0
        self.rejected = 0  # not a control message, or not addressed as its topic says
        self.unexpected = 0  # from no peer of ours, or for no attached node
        self.stale = 0  # retained where nothing is kept: an earlier party's leftovers
        self.stalls = 0  # times the socket was full and the rest waited for writability
        self._prefix = f"oddl/{testbed}/node/"
        self._telemetry = telemetry_topic(testbed, "")
        self._status = status_topic(testbed, user)
        self._said = (b" " + session.encode()) if session else b""  # after each status
        self._inbox: list[tuple[str, bytes]] = []
        self._acks: dict[int, asyncio.Future[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: Any = None
        self._writing = False
        self._flush_due = False
        self._thread = threading.get_ident()
        self._misc: asyncio.Task[None] | None = None
        self._connack: asyncio.Future[Any] | None = None
        self._started = False
        self.lost = asyncio.Event()  # the broker went away under us
        self.losses = 0  # how often: `lost` is cleared again on reconnect, this is not
        c = self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=user,
                                      protocol=mqtt.MQTTv311)
        if password is not None:
            c.username_pw_set(user, password)
        if tls_context is not None:
            c.tls_set_context(tls_context)
        if not readonly:
            c.will_set(self._status, b"offline" + self._said, qos=QOS_STATUS, retain=True)
        c.on_socket_open = self._on_open
        c.on_socket_close = self._on_close
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        c.on_publish = self._on_publish
        c.on_disconnect = self._on_disconnect
        c.on_socket_register_write = self._on_want_write

    @property
    def sent(self) -> int:
        return self._sent

    def attach(self, node: str, handler: Callable[[ControlMessage], None]) -> None:
        """Take `node`'s control messages (subscribed once, for the connection's life)."""
        new = node not in self.handlers
        self.handlers[node] = handler
        if new and self._started:
            self.client.subscribe(ctl_topic(self.testbed, node, "+"), qos=QOS_CTL)

    def on(self, topic_filter: str, handler: RawHandler) -> None:
        """Hand every message on `topic_filter` (size-bounded) to `handler(topic, payload)`."""
        self.raw[topic_filter] = handler
        if self._started:
            self.client.subscribe(topic_filter, qos=1)

    def send(self, src: str, dst: str, msg: ControlMessage) -> None:
        self._sent += 1
        if not self._started:
            log.warning("mqtt: %s: %s to %s while not connected: dropped", self.user,
                        type(msg).__name__, dst)
            return
        topic, payload = ctl_topic(self.testbed, dst, src), encode(msg)
        if cassette.active is not None:
            self._taped("pub", topic, payload)
        self.client.publish(topic, payload, QOS_CTL)

    async def publish(self, topic: str, payload: bytes, qos: int = 1,
                      timeout: float = 10.0, retain: bool = False) -> None:
        """Publish on a raw topic; with QoS 1, return once the broker has it (PUBACK)."""
        if not self._started:
            raise BusError(f"mqtt: {self.user}: not connected")
        if cassette.active is not None:
            self._taped("pub", topic, payload)
        info = self.client.publish(topic, payload, qos, retain)
        if qos == 0 or info.is_published():
            return
        assert self._loop is not None
        fut = self._acks[info.mid] = self._loop.create_future()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(fut)
        except TimeoutError:
            raise BusError(f"mqtt: {self.user}: no PUBACK for {topic} within {timeout} s "
                           f"(a broker that refuses a publish does not say so: is this "
                           f"party allowed to write it?)") from None
        finally:
            self._acks.pop(info.mid, None)

    # --- connection ----------------------------------------------------------------------
    async def start(self) -> MQTTBus:
        loop = self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._connack = loop.create_future()
        try:  # the TCP (and TLS) handshake blocks: off the loop, as aiomqtt does it
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.to_thread(self.client.connect, self.host, self.port,
                                        self.keepalive)
            async with asyncio.timeout(self.connect_timeout):
                rc = await self._connack
        except (OSError, ssl.SSLError, TimeoutError) as e:
            self._drop()
            raise BusError(f"mqtt: {self.user}: cannot reach the broker at "
                           f"{self.host}:{self.port}: {e!r}") from None
        if rc.is_failure:
            self._drop()
            raise BusError(f"mqtt: {self.user}: the broker at {self.host}:{self.port} "
                           f"refused the connection: {rc}" + (
                               f" (a session as {self.user} is connected already: one "
                               f"program a party)" if "identifier" in str(rc).lower() else ""))
        self._started = True
        for node in self.handlers:
            self.client.subscribe(ctl_topic(self.testbed, node, "+"), qos=QOS_CTL)
        for topic_filter in self.raw:
            self.client.subscribe(topic_filter, qos=1)
        if not self.readonly:
            self.client.publish(self._status, b"online" + self._said, qos=QOS_STATUS,
                                retain=True)
        self._flush()
        self._misc = loop.create_task(self._keepalive())
        return self

    async def reconnect(self, give_up_s: float | None = None) -> None:
        """After `lost`: connect again, backing off from 0.1 s to 5 s between attempts,
        until the broker takes us (subscriptions and status restored) or `give_up_s`."""
        self._started = False
        if self._misc is not None:
            self._misc.cancel()
        self._drop()
        for fut in self._acks.values():  # what the lost connection never acknowledged
            if not fut.done():
                fut.set_exception(BusError(f"mqtt: {self.user}: the broker went away"))
        delay, tries = 0.1, 0
        deadline = None if give_up_s is None else time.monotonic() + give_up_s
        while True:
            tries += 1
            try:
                await self.start()
                self.lost.clear()
                log.warning("mqtt: %s: back on the broker after %d attempts", self.user,
                            tries)
                return
            except BusError as e:
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise
                if worth_logging(tries):
                    log.warning("%s; trying again in %.1f s", e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def abandon(self) -> None:
        """Drop the connection without a DISCONNECT, as a process that dies does: the
        broker publishes this party's will. Nothing more is sent."""
        self._started = False
        if self._misc is not None:
            self._misc.cancel()
            self._misc = None
        self._drop()

    async def close(self, timeout: float = 5.0) -> None:
        """Leave cleanly (status 'offline', DISCONNECT), bounded: a broker that has gone
        away must not hang whoever is shutting down; never started: nothing to do."""
        if not self._started:
            return
        self._started = False
        if self._misc is not None:
            self._misc.cancel()
        try:
            if not self.readonly:
                info = self.client.publish(self._status, b"offline" + self._said,
                                           qos=QOS_STATUS, retain=True)
                self._flush()
                deadline = time.monotonic() + timeout
                while not info.is_published() and self._sock is not None:
                    if time.monotonic() > deadline:
                        raise TimeoutError("no PUBACK for the status")
                    await asyncio.sleep(0.001)
            self.client.disconnect()
            self._flush()
        except (TimeoutError, OSError, RuntimeError) as e:
            log.warning("mqtt: %s left without a clean disconnect: %r", self.user, e)
        self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            self._on_close(self.client, None, self._sock)
        with contextlib.suppress(OSError):
            sock = self.client.socket()
            if sock is not None:
                sock.close()

    async def _keepalive(self) -> None:
        loop = asyncio.get_running_loop()
        while self.client.loop_misc() == mqtt.MQTT_ERR_SUCCESS and self._sock is not None:
            self._flush()
            # on whole seconds: the connections of one process (an emulator's 64) wake
            # it once a second, not 64 times
            await asyncio.sleep(1 - loop.time() % 1)
        log.warning("mqtt: %s: connection to the broker lost", self.user)
        self._lose()

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

    def _lose(self) -> None:
        self.losses += 1
        self.lost.set()

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: Any,
                       props: Any = None) -> None:
        if self._started:  # not our own DISCONNECT: the protocol's retries take over
            log.warning("mqtt: %s: disconnected from the broker: %s", self.user, rc)
            self._lose()

    def _on_message(self, client: mqtt.Client, userdata: Any, m: mqtt.MQTTMessage) -> None:
        if m.retain and not self._kept(m.topic):
            # a broker keeps whatever a party publishes retained, on any topic it may write;
            # only statuses and the controller's standing notes are kept on purpose: the
            # rest is a leftover (junk a node left would be every later run's "disturbance")
            self.stale += 1
            if worth_logging(self.stale):
                log.warning("mqtt: %s: a retained message on %s, where nothing is kept: "
                            "dropped (%d so far)", self.user, m.topic, self.stale)
            return
        self._inbox.append((m.topic, bytes(m.payload)))  # handled once paho is out of its read

    def _kept(self, topic: str) -> bool:
        """Is `topic` one where a retained message is meant (a status, a standing note)?"""
        if topic.startswith(status_topic(self.testbed, "")):
            return True
        note = telemetry_topic(self.testbed, CONTROLLER) + "/"
        return topic.startswith(note) and topic[len(note):].partition("/")[0] in RETAINED

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, rc: Any = None,
                    props: Any = None) -> None:
        fut = self._acks.get(mid)  # only a QoS 1 `publish` waits (its PUBACK comes later)
        if fut is not None and not fut.done():
            fut.set_result(None)

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

    def _taped(self, kind: str, topic: str, payload: bytes) -> None:
        """A message published or delivered, on the cassette being recorded (not the
        telemetry for watchers, which timing shapes: no device's traffic)."""
        if isinstance(cassette.active, cassette.Recorder) and \
                not topic.startswith(self._telemetry):
            cassette.active.event(self.dev, kind, topic=topic, p=payload.decode("latin-1"))

    def _deliver(self, topic: str, payload: bytes) -> None:
        """One message; whatever it holds, it is handled, or counted and logged, alone."""
        if cassette.active is not None:
            self._taped("recv", topic, payload)
        try:
            if topic.startswith(self._prefix):
                self._control(topic, payload)
            else:
                self._raw(topic, payload)
        except Exception as e:  # a handler's bug (or a decoder's) must not take the bus down
            self._reject("message on %s failed: %r", topic, e)

    def _reject(self, why: str, *args: object) -> None:
        self.rejected += 1
        if worth_logging(self.rejected):
            log.warning(f"mqtt: %s: {why} (%d rejected so far)", self.user, *args,
                        self.rejected)

    def _raw(self, topic: str, payload: bytes) -> None:
        for f, handler in self.raw.items():
            if mqtt.topic_matches_sub(f, topic):
                if len(payload) > MAX_RAW_BYTES:
                    self._reject("%d bytes on %s: over %d, dropped", len(payload), topic,
                                 MAX_RAW_BYTES)
                    return
                handler(topic, payload)
                return
        self.unexpected += 1

    def _control(self, topic: str, payload: bytes) -> None:
        dst, ctl, src = topic[len(self._prefix):].partition("/ctl/")
        handler = self.handlers.get(dst) if ctl else None
        if handler is None or (self.peers is not None and src not in self.peers):
            self.unexpected += 1
            log.debug("mqtt: %s: message on %s for no job of ours dropped", self.user, topic)
            return
        try:
            msg = decode(payload)
        except BusDecodeError as e:  # bounded in size before it is parsed
            return self._reject("%s: rejected message: %s", topic, e)
        if msg.dst != dst or msg.src != src:
            return self._reject("%s: message from %s to %s does not match its topic", topic,
                                msg.src, msg.dst)
        self.received += 1
        if self.tap is not None:
            self.tap(dst, msg)
        handler(msg)


async def request_grant_rtt(bus: Any, n: int, warmup: int = 20, timeout_s: float = 60.0,
                            a: str = "n0", b: str = "n1") -> list[float]:
    """REQUEST a -> b, b GRANTs at once, through the bus's broker: n round trips (seconds),
    after `warmup` discarded ones. `bus` is an MQTTBus not yet started."""
    from oddl.controller.base.messages import Grant, Request

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
        async with asyncio.timeout(timeout_s):
            await done.wait()
    finally:
        await bus.close()
    # timed on this host's clock: a replay gives the recorded times (the exchange itself
    # is replayed, at the replaying host's pace, which is no measure of the broker's)
    return cassette.value(f"request-grant rtt {a}->{b}", lambda: samples[warmup:])


class CredentialsError(ValueError):
    """A party's password cannot be had (unset variable, missing or exposed file)."""


def password_of(broker: Any, user: str) -> str | None:
    """`user`'s own password: from `[broker] password_env` if that variable is set, else
    from `password_file` (mode 0600 or stricter)."""
    if broker.password_env and broker.password_env in os.environ:
        return os.environ[broker.password_env]
    if broker.password_file:
        path = Path(broker.password_file.replace("{user}", user))
        try:
            mode = path.stat().st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise CredentialsError(f"broker password file {path} is readable by others "
                                       f"(mode {mode & 0o777:o}): chmod 600 it")
            return read_secret(path)
        except OSError as e:
            raise CredentialsError(f"broker password file for {user}: {e}") from None
    if broker.password_env:
        raise CredentialsError(f"broker password for {user}: environment variable "
                               f"{broker.password_env} is not set")
    return None


def broker_params(broker: Any, user: str, port: int | None = None) -> dict[str, Any]:
    """How `user` connects to a testbed's `[broker]` (an embedded broker's port given)."""
    if broker.url == "embedded":
        if port is None:
            raise ValueError("the embedded broker's port is known only once it runs")
        return {"host": broker.bind, "port": port, "password": password_of(broker, user)}
    scheme, host, bport = broker.endpoint()
    tls = ssl.create_default_context(cafile=broker.ca_file) if scheme == "mqtts" else None
    return {"host": host, "port": bport, "password": password_of(broker, user),
            "tls_context": tls}


def bus_from_config(testbed: str, broker: Any, user: str, port: int | None = None,
                    tap: Callable[[str, ControlMessage], None] | None = None,
                    password: str | None = None, keepalive: int = 60,
                    readonly: bool = False, session: str = "") -> MQTTBus:
    """An MQTTBus for a testbed's `[broker]`, logged in as `user` (its password from the
    config's source unless given)."""
    if isinstance(cassette.active, cassette.Player):  # replayed: no broker, its record
        return PlayedBus(cassette.active, testbed, user=user, tap=tap, readonly=readonly,
                         session=session)
    p = broker_params(broker, user, port)
    if password is not None:
        p["password"] = password
    return MQTTBus(testbed, **p, user=user, tap=tap, keepalive=keepalive, readonly=readonly,
                   session=session)


class PlayedBus(MQTTBus):
    """An MQTTBus whose broker is a cassette: each message it publishes is held to the
    recording, and the messages that were delivered after it come as long after it as
    they did (the recording's timing; the handlers are the bus's own)."""

    def __init__(self, player: cassette.Player, testbed: str, **kw: Any) -> None:
        super().__init__(testbed, **kw)
        self.player = player

    async def start(self) -> MQTTBus:
        self._loop = asyncio.get_running_loop()
        self._started = True
        self._play(None)  # what came before anything was published
        return self

    async def close(self, timeout: float = 5.0) -> None:
        self._started = False

    def send(self, src: str, dst: str, msg: ControlMessage) -> None:
        self._sent += 1
        self._out(ctl_topic(self.testbed, dst, src), encode(msg))

    async def publish(self, topic: str, payload: bytes, qos: int = 1,
                      timeout: float = 10.0, retain: bool = False) -> None:
        if not topic.startswith(self._telemetry):  # (not recorded)
            self._out(topic, payload)

    def _out(self, topic: str, payload: bytes) -> None:
        self._play(self.player.take(self.dev, "pub", topic=topic,
                                    p=payload.decode("latin-1")))

    def _play(self, after: dict[str, Any] | None) -> None:
        assert self._loop is not None
        now = time.monotonic()
        for ev in self.player.following(self.dev, "recv"):
            due = now + (ev["t"] - after["t"] if after is not None else 0.0)
            # the loop's timers wake to the millisecond (epoll): early, then to the due
            self._loop.call_later(max(0.0, due - now - 0.002), self._at, due, ev["topic"],
                                  ev["p"].encode("latin-1"))

    def _at(self, due: float, topic: str, payload: bytes) -> None:
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        self._deliver(topic, payload)
