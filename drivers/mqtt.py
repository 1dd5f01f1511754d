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
from collections.abc import Callable
from typing import Any

import aiomqtt

from controller.messages import ControlMessage
from controller.wire import BusDecodeError, decode, encode

log = logging.getLogger(__name__)

QOS_CTL = 0
QOS_STATUS = 1


def ctl_topic(testbed: str, node: str) -> str:
    return f"oddl/{testbed}/node/{node}/ctl"


def status_topic(testbed: str, client: str) -> str:
    return f"oddl/{testbed}/status/{client}"


class MQTTBus:
    def __init__(self, testbed: str, host: str = "127.0.0.1", port: int = 1883, *,
                 username: str | None = None, password: str | None = None,
                 tls_context: ssl.SSLContext | None = None, client_id: str = "oddl-ctl",
                 tap: Callable[[str, ControlMessage], None] | None = None) -> None:
        self.testbed = testbed
        self.tap = tap  # an observer of every delivered message (the invariant checker)
        self.client_id = client_id
        self.handlers: dict[str, Callable[[ControlMessage], None]] = {}
        self._sent = 0
        self.received = 0
        self.rejected = 0
        self._out: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._status = status_topic(testbed, client_id)
        self.client = aiomqtt.Client(
            host, port, username=username, password=password, identifier=client_id,
            tls_context=tls_context,
            will=aiomqtt.Will(self._status, b"offline", qos=QOS_STATUS, retain=True),
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])

    @property
    def sent(self) -> int:
        return self._sent

    def attach(self, node: str, handler: Callable[[ControlMessage], None]) -> None:
        self.handlers[node] = handler

    def send(self, src: str, dst: str, msg: ControlMessage) -> None:
        self._sent += 1
        self._out.put_nowait((ctl_topic(self.testbed, dst), encode(msg)))

    async def start(self) -> MQTTBus:
        await self.client.__aenter__()  # raises aiomqtt.MqttError (e.g. not authorised)
        for node in self.handlers:
            await self.client.subscribe(ctl_topic(self.testbed, node), qos=QOS_CTL)
        await self.client.publish(self._status, b"online", qos=QOS_STATUS, retain=True)
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._write())]
        self._started = True
        return self

    async def close(self, timeout: float = 5.0) -> None:
        """Leave cleanly (status 'offline', DISCONNECT), bounded: a broker that has gone
        away must not hang whoever is shutting down; never started: nothing to do."""
        if not self._started:
            return
        self._started = False
        try:
            await asyncio.wait_for(self._close(), timeout)
        except (TimeoutError, aiomqtt.MqttError) as e:
            log.warning("mqtt: %s left without a clean disconnect: %r", self.client_id, e)

    async def _close(self) -> None:
        for _ in range(100):  # let what was sent leave (bounded)
            if self._out.empty():
                break
            await asyncio.sleep(0.001)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await t
        with contextlib.suppress(aiomqtt.MqttError):
            await self.client.publish(self._status, b"offline", qos=QOS_STATUS, retain=True)
        await self.client.__aexit__(None, None, None)

    async def _write(self) -> None:
        while True:
            topic, payload = await self._out.get()
            await self.client.publish(topic, payload, qos=QOS_CTL)

    async def _read(self) -> None:
        prefix = f"oddl/{self.testbed}/node/"
        async for m in self.client.messages:
            topic = str(m.topic)
            node = topic[len(prefix):-len("/ctl")] if topic.startswith(prefix) else ""
            handler = self.handlers.get(node)
            if handler is None:
                self.rejected += 1
                log.warning("mqtt: message on %s for no attached node dropped", topic)
                continue
            try:
                msg = decode(bytes(m.payload))  # type: ignore[arg-type]
            except BusDecodeError as e:
                self.rejected += 1
                log.warning("mqtt: %s: rejected message: %s", topic, e)
                continue
            if msg.dst != node:
                self.rejected += 1
                log.warning("mqtt: %s: message addressed to %s dropped", topic, msg.dst)
                continue
            self.received += 1
            try:
                if self.tap is not None:
                    self.tap(node, msg)
                handler(msg)
            except Exception:  # a control unit's bug must not take the bus down
                log.exception("mqtt: handler for %s failed on %r", node, msg)


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
