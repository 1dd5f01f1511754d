"""The zero-setup MQTT broker: amqtt embedded in process, on 127.0.0.1 only, holding every
party to its own identity and topics (controller/base/access.py), as Mosquitto does in a lab
with the files `oddl broker-config` writes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import socket
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from amqtt.broker import Broker
from amqtt.contexts import Action
from amqtt.errors import AMQTTError
from amqtt.mqtt.connack import BAD_USERNAME_PASSWORD, IDENTIFIER_REJECTED, ConnackPacket
from amqtt.mqtt.constants import QOS_1, QOS_2
from amqtt.mqtt.protocol.broker_handler import BrokerProtocolHandler
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin
from amqtt.session import Session
from amqtt.utils import gen_client_id
from oddl.controller.base.access import Rule, permits, rules
from oddl.controller.base.throttle import worth_logging

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0  # a connection that has not sent its CONNECT by then is closed
LEAVING_S = 1.0  # a live session of a CONNECT's client id may take this long to go
WAITING_PER_ADDRESS = 64  # connections from one address waiting to send their CONNECT


MAX_CACHED = 1 << 16  # the verdicts the broker keeps (topics x filters, parties x topics)


class _OurRefusals(logging.Filter):
    """amqtt logs a warning for every CONNECT our broker refuses ("Failed to initialize
    client session: refused: ..."), on top of ours: a wrong-password flood wrote 4.3 MB in
    10 s. Ours is counted and throttled (`_Broker.refused`); amqtt's echo of it is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(
            "Failed to initialize client session: refused: ")


logging.getLogger("amqtt.broker").addFilter(_OurRefusals())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _digest(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def refusal(parties: Mapping[str, str], session: Session) -> str | None:
    """Why a CONNECT is refused, or None. `parties`: username -> sha256 of its password."""
    user, password = session.username, session.password
    want = parties.get(user or "")
    if user is None or password is None or want is None:
        return f"unknown party {user!r}" if user else "anonymous"
    if not hmac.compare_digest(want, _digest(password)):
        return f"{user}: wrong password"
    if session.client_id != user:
        return f"{user}: client id {session.client_id!r} is not its username"
    return None


class PartyAuth(BaseAuthPlugin):
    """Only known parties, each with its own password, each as its own client id."""

    @dataclass
    class Config:
        parties: dict[str, str] = field(default_factory=dict)

    async def authenticate(self, *, session: Session) -> bool | None:
        return refusal(self.config.parties, session) is None


class PartyTopics(BaseTopicPlugin):
    """Each party reads and writes only the topics controller/base/access.py gives it."""

    @dataclass
    class Config:
        testbed: str = ""
        nodes: list[str] = field(default_factory=list)

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._rules: dict[str, list[Rule]] = {}
        self._verdicts: dict[tuple[str, str, str], bool] = {}  # (user, access, topic)
        self.denied = 0

    def _of(self, user: str) -> list[Rule]:
        if user not in self._rules:
            self._rules[user] = rules(self.config.testbed, user, self.config.nodes)
        return self._rules[user]

    async def topic_filtering(self, *, session: Session | None = None,
                              topic: str | None = None, action: Action | None = None) -> bool:
        return self.verdict(session, topic, action)

    def verdict(self, session: Session | None, topic: str | None,
                action: Action | None) -> bool:
        """`topic_filtering`, without a coroutine: what the broker asks for each message
        and subscriber (through amqtt's plugin manager: a task and a gather each)."""
        if session is None or session.username is None or topic is None:
            return False
        access = "write" if action == Action.PUBLISH else "read"
        key = (session.username, access, topic)
        ok = self._verdicts.get(key)
        if ok is None:  # a party's rules are fixed: each verdict is worked out once
            if len(self._verdicts) >= MAX_CACHED:
                self._verdicts.clear()
            ok = self._verdicts[key] = permits(self._of(session.username), access, topic)
        if not ok and action != Action.RECEIVE:
            self.denied += 1
            if worth_logging(self.denied):
                log.warning("broker: %s may not %s %s (%d denied so far)", session.username,
                            access, topic, self.denied)
        return ok


class _Broker(Broker):
    """amqtt's broker, with four fixes (each method below says what amqtt 0.12 does wrong).
    The first: a CONNECT is authenticated *before* the broker touches its session table.
    amqtt drops the session of a clean-session client id and takes a live one over before
    it asks the auth plugins, so that anyone, even a refused client, could disconnect a
    party by connecting with its client id."""

    def __init__(self, config: dict[str, Any], parties: Mapping[str, str], testbed: str,
                 nodes: list[str]) -> None:
        super().__init__(config)
        self.refused = 0
        self.connect_timeout_s = CONNECT_TIMEOUT_S
        # per address, the connections still to send their CONNECT (oldest first)
        self._waiting: dict[str, dict[int, Any]] = {}
        self.writers: weakref.WeakSet[Any] = weakref.WeakSet()  # open connections (`stop`)
        self.parties, self.testbed, self.nodes = parties, testbed, nodes
        self._matched: dict[tuple[str, str], bool] = {}  # (topic, filter): does it match?
        self._topics: PartyTopics | None = None

    def _refuse(self, peer: str, why: str) -> AMQTTError:
        """A CONNECT refused: counted, logged (the first 20, then one a thousand), and the
        error amqtt is to end the connection with (its own log of it is filtered)."""
        self.refused += 1
        if worth_logging(self.refused):
            log.warning("broker: connection from %s refused: %s (%d refused so far)", peer,
                        why, self.refused)
        return AMQTTError(f"refused: {why}")

    async def _connect(self, reader: Any, writer: Any, address: str) -> Any:
        """The connection's CONNECT, within `connect_timeout_s`. At most WAITING_PER_ADDRESS
        connections from one address wait to send theirs: a newcomer beyond that closes
        the one waiting longest (a party sends its CONNECT at once; 4,100 idle connections
        took every slot and locked every party out)."""
        waiting = self._waiting.setdefault(address, {})
        if len(waiting) >= WAITING_PER_ADDRESS:
            oldest = next(iter(waiting))
            with contextlib.suppress(Exception):
                await waiting.pop(oldest).close()
        key = id(writer)
        waiting[key] = writer
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await BrokerProtocolHandler.init_from_connect(
                    reader, writer, self.plugins_manager)
        except Exception as e:  # idle, evicted, or not MQTT
            why = (f"no CONNECT within {self.connect_timeout_s:g} s"
                   if isinstance(e, TimeoutError) else f"no CONNECT ({type(e).__name__})")
            with contextlib.suppress(Exception):
                await writer.close()
            raise self._refuse(address, why) from None
        finally:
            waiting.pop(key, None)
            if not waiting:
                self._waiting.pop(address, None)

    async def _initialize_client_session(self, reader: Any, writer: Any, remote_address: str,
                                         remote_port: int) -> Any:
        handler, session = await self._connect(reader, writer, remote_address)
        why = refusal(self.parties, session)
        if why is None and session.will_flag:
            user = session.username or ""
            if not permits(rules(self.testbed, user, self.nodes), "write",
                           session.will_topic or ""):
                why = f"{user}: may not leave a will on {session.will_topic}"
        code = BAD_USERNAME_PASSWORD
        if why is None and session.client_id in self._sessions:
            live, _ = self._sessions[session.client_id]
            # a party that has just left (its DISCONNECT not yet handled) comes back at once
            for _ in range(round(LEAVING_S / 0.01)):
                if live.transitions.state != "connected":
                    break
                await asyncio.sleep(0.01)
            else:
                # a party's second session would have taken the first one's subscriptions
                # and left it connected, deaf (amqtt 0.12): refused, the first goes on
                why = (f"{session.client_id} is connected already (one session a party: "
                       f"two controllers never drive one testbed)")
                code = IDENTIFIER_REJECTED
        if why is not None:
            await ConnackPacket.build(0, code).to_stream(writer)
            await writer.close()
            raise self._refuse(f"{remote_address}:{remote_port}", why)
        # from here on, amqtt's own (0.12 broker.py `_initialize_client_session`)
        if session.clean_session:
            await self._delete_session(session.client_id)
            session.parent = 0
        elif session.client_id in self._sessions:
            old, _ = self._sessions[session.client_id]
            for k in ("will_flag", "will_message", "will_topic", "will_qos", "keep_alive",
                      "username", "password"):
                setattr(old, k, getattr(session, k))
            session = old
            session.parent = 1
        else:
            session.parent = 0
        if not session.client_id:
            session.client_id = gen_client_id()
        self.writers.add(writer)
        return handler, session

    async def _client_message_loop(self, client_session: Session, handler: Any) -> None:
        """Then deliver, in order, what the party published before it left. amqtt 0.12
        ends a client's loop at its DISCONNECT with PUBLISHes still in the session's
        queue and drops them: a sim run's last QoS-0 notes, sent just before its clean
        disconnect, never reached the dashboard. Mosquitto delivers them (after the
        will, here, when the party vanished without a DISCONNECT)."""
        await super()._client_message_loop(client_session, handler)
        queue = client_session.delivered_message_queue
        while not queue.empty():
            message = asyncio.get_running_loop().create_future()
            message.set_result(queue.get_nowait())
            if not await self._handle_message_delivery(client_session, handler, message):
                break  # a topic amqtt closes the connection for: nothing after it

    async def _topic_filtering(self, session: Session, topic: str, action: Action) -> bool:
        """Our one topic plugin's verdict, asked directly (amqtt maps every plugin through
        tasks, for each message and each subscriber)."""
        if self._topics is None:
            self._topics = next(p for p in self.plugins_manager.plugins
                                if isinstance(p, PartyTopics))
        return self._topics.verdict(session, topic, action)

    def _matches(self, topic: str, a_filter: str) -> bool:
        """amqtt's match, worked out once per topic and filter: every message was matched
        against every filter (64 node programs hold ~320), the emulator's largest cost
        while a job ran."""
        key = (topic, a_filter)
        hit = self._matched.get(key)
        if hit is None:
            if len(self._matched) >= MAX_CACHED:
                self._matched.clear()
            hit = self._matched[key] = super()._matches(topic, a_filter)
        return hit

    async def _run_broadcast(self, running_tasks: deque[asyncio.Task[Any]]) -> None:
        """One message to its subscribers, as amqtt 0.12 does, but over a snapshot of the
        subscription table. amqtt walks the live table and awaits the topic plugin on the
        way: a party that subscribes or leaves meanwhile ends the walk ("dictionary changed
        size during iteration", logged only as a task exception never retrieved), and the
        message is lost to every subscriber not yet served. A node's iteration report lost
        so left its peers waiting for it, and the job hung."""
        broadcast = await self._broadcast_queue.get()
        topic = broadcast["topic"]
        targets = [(session, broadcast.get("qos", qos))
                   for a_filter, subs in list(self._subscriptions.items())
                   if self._matches(topic, a_filter) for session, qos in list(subs)]
        for session, qos in targets:
            if not await self._topic_filtering(session, topic=topic, action=Action.RECEIVE):
                continue
            connected = session.transitions.state == "connected"
            if not connected and not session.clean_session and qos in (QOS_1, QOS_2) \
                    and not session.is_anonymous:  # kept for the party's return
                await self._retain_broadcast_message(broadcast, qos, session)
            elif connected and (handler := self._get_handler(session)):
                running_tasks.append(asyncio.ensure_future(
                    handler.mqtt_publish(topic, broadcast["data"], qos, retain=False)))

    async def _publish_retained_messages_for_subscription(
            self, subscription: tuple[str, int], session: Session) -> None:
        """The retained messages of a filter the party holds, and may read. amqtt 0.12
        calls this at every CONNECT for every filter of *every* party, and sends without
        asking the topic plugin: a node that connected got the dashboard's retained
        telemetry, which it neither subscribed to nor may read."""
        a_filter, qos = subscription
        handler = self._get_handler(session)
        if handler is None or all(s.client_id != session.client_id
                                  for s, _ in self._subscriptions.get(a_filter, ())):
            return  # another party's filter: nothing awaited, so amqtt's walk stays valid
        sends = []
        for topic, retained in list(self._retained_messages.items()):
            if self._matches(topic, a_filter) and await self._topic_filtering(
                    session, topic=topic, action=Action.RECEIVE):
                sends.append(asyncio.ensure_future(handler.mqtt_publish(
                    retained.topic, retained.data, min(qos, retained.qos or qos), retain=True)))
        if sends:
            await asyncio.wait(sends)


_AUTH = f"{__name__}.PartyAuth"
_TOPICS = f"{__name__}.PartyTopics"


class EmbeddedBroker:
    """An amqtt broker bound to loopback that admits only the testbed's parties."""

    def __init__(self, testbed: str, nodes: list[str], passwords: Mapping[str, str],
                 host: str = "127.0.0.1", port: int | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.host = host
        self.connect_timeout_s = connect_timeout_s
        self.port = port or free_port(host)
        self.testbed, self.nodes = testbed, list(nodes)
        self._parties = {u: _digest(p) for u, p in passwords.items()}
        self._broker: Any = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def refused(self) -> int:
        """CONNECTs refused (unknown party, wrong password, another's client id or will)."""
        return self._broker.refused if self._broker is not None else 0

    async def start(self) -> EmbeddedBroker:
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}",
                                      "max_connections": 4096}},
            "plugins": {_AUTH: {"parties": self._parties},
                        _TOPICS: {"testbed": self.testbed, "nodes": self.nodes}},
        }
        self._broker = _Broker(config, self._parties, self.testbed, self.nodes)
        self._broker.connect_timeout_s = self.connect_timeout_s
        await self._broker.start()
        return self

    async def stop(self) -> None:
        """Gone as a broker process that stops is: every connection drops at once (amqtt's
        shutdown alone leaves established ones open), retained messages and sessions go."""
        if self._broker is not None:
            b, self._broker = self._broker, None
            for server in b._servers.values():  # the listener first: nobody gets back in
                await server.close_instance()  # (amqtt 0.12, pinned: a private table)
            for w in list(b.writers):
                with contextlib.suppress(Exception):
                    await w.close()
            await b.shutdown()
