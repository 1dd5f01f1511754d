"""The emulated QICK soc served the way a lab serves a real one: `qick.pyro`.

A Pyro4 name server and the soc's daemon on loopback, each in a daemon thread, as qick's
own `start_server` sets them up (`soc_class` = EmulatedQickSoc: the soc and its
autoproxied members registered, pickle as the serializer), so that
`qick.pyro.make_proxy(host, port, name)` on the client side is the lab's call. Pyro4 as
qick configures it unpickles what a client sends; so, given `hmac_key`, both the name
server and the daemon take only messages signed with it (Pyro4 checks a message's HMAC
before its payload is deserialized), and a stranger's call is refused unread
(`drivers.lightning.open_soc` signs with the key the emu testbed's `hmac_key_file`
names). qick's `start_server` has no key to give: that is why the daemon is set up here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from oddl.sim.devices.broker import free_port
from oddl.sim.devices.lightning_datapath import DatapathSpec
from oddl.sim.devices.qick_soc import EmulatedQickSoc, Photonics

PROXY_NAME = "oddl-qick"


class QickPyroServer:
    def __init__(self, photonics: Photonics, host: str = "127.0.0.1",
                 name: str = PROXY_NAME, n_dacs: int = 2,
                 engine: Callable[[], tuple[Any, Any]] | None = None,
                 datapath: DatapathSpec | None = None, hmac_key: bytes | None = None
                 ) -> None:
        """`engine`, `datapath`: the fabric's Lightning datapath (EmulatedQickSoc's);
        `hmac_key`: every message must be signed with it (None: none is)."""
        self.hmac_key = hmac_key
        self.photonics = photonics
        self.n_dacs = n_dacs
        self.engine, self.datapath = engine, datapath
        self.host = host
        self.name = name
        self.ns_port = free_port(host)
        self._ns_daemon: Any = None
        self._daemon: Any = None

    @property
    def url(self) -> str:
        return f"pyro://{self.host}:{self.ns_port}/{self.name}"

    def start(self) -> QickPyroServer:
        import Pyro4
        import Pyro4.naming

        # qick.pyro.start_server's settings
        Pyro4.config.REQUIRE_EXPOSE = False
        Pyro4.config.SERIALIZER = "pickle"
        Pyro4.config.SERIALIZERS_ACCEPTED = {"pickle"}
        Pyro4.config.PICKLE_PROTOCOL_VERSION = 4
        key = self.hmac_key
        _, self._ns_daemon, _ = Pyro4.naming.startNS(host=self.host, port=self.ns_port,
                                                     enableBroadcast=False, hmac=key)
        threading.Thread(target=self._ns_daemon.requestLoop, daemon=True,
                         name="pyro-ns").start()
        soc = EmulatedQickSoc(photonics=self.photonics, n_dacs=self.n_dacs,
                              engine=self.engine, datapath=self.datapath)
        self._daemon = Pyro4.Daemon(host=self.host)
        self._daemon._pyroHmacKey = key
        ns = Pyro4.locateNS(host=self.host, port=self.ns_port, hmac_key=key)
        ns.register(self.name, self._daemon.register(soc))
        for obj in soc.autoproxy:  # (its members, reached through the soc's proxy)
            self._daemon.register(obj)
        threading.Thread(target=self._daemon.requestLoop, daemon=True,
                         name="qick-pyro").start()
        return self

    def stop(self) -> None:
        for d in (self._daemon, self._ns_daemon):
            if d is not None:
                d.shutdown()
