"""The emulated QICK soc served the way a lab serves a real one: `qick.pyro`.

A Pyro4 name server and qick's own `start_server` (with `soc_class` = EmulatedQickSoc)
on loopback, each in a daemon thread, so that `qick.pyro.make_proxy(host, port, name)` on
the client side is exactly the lab's call. Pyro4 as qick configures it uses pickle: it
listens on 127.0.0.1 only, and a real board's server belongs on a trusted network.
"""

from __future__ import annotations

import threading
import time
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
                 datapath: DatapathSpec | None = None) -> None:
        """`engine`, `datapath`: the fabric's Lightning datapath (EmulatedQickSoc's)."""
        self.photonics = photonics
        self.n_dacs = n_dacs
        self.engine, self.datapath = engine, datapath
        self.host = host
        self.name = name
        self.ns_port = free_port(host)
        self._ns_daemon: Any = None

    @property
    def url(self) -> str:
        return f"pyro://{self.host}:{self.ns_port}/{self.name}"

    def start(self, timeout: float = 20.0) -> QickPyroServer:
        import Pyro4
        import Pyro4.naming
        from qick.pyro import start_server

        Pyro4.config.SERIALIZERS_ACCEPTED = {"pickle"}
        Pyro4.config.PICKLE_PROTOCOL_VERSION = 4
        _, self._ns_daemon, _ = Pyro4.naming.startNS(host=self.host, port=self.ns_port,
                                                     enableBroadcast=False)
        threading.Thread(target=self._ns_daemon.requestLoop, daemon=True,
                         name="pyro-ns").start()
        photonics, engine, datapath = self.photonics, self.engine, self.datapath

        def serve() -> None:  # qick prints its progress lines ("found nameserver", ...)
            start_server(self.host, self.ns_port, self.name, soc_class=EmulatedQickSoc,
                         iface="lo", photonics=photonics, n_dacs=self.n_dacs,
                         engine=engine, datapath=datapath)

        threading.Thread(target=serve, daemon=True, name="qick-pyro").start()
        ns = Pyro4.locateNS(host=self.host, port=self.ns_port)
        deadline = time.monotonic() + timeout
        while self.name not in ns.list():  # registered once qick has built the soc
            if time.monotonic() > deadline:
                raise RuntimeError("the emulated QICK soc did not register with Pyro4")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._ns_daemon is not None:
            self._ns_daemon.shutdown()
