"""The node side of stage 2 over MQTT: bad jobs are dropped, a failing job says why, and
the host serves the next job."""

from __future__ import annotations

import asyncio

import aiomqtt
import msgspec
from oddl.controller.nodejob import (
    JOB_VERSION,
    JobEvent,
    JobSpec,
    NodeJobHost,
    result_topic,
    run_topic,
)
from oddl.drivers.mqtt import MQTTBus
from oddl.sim.broker import EmbeddedBroker


def test_bad_jobs_dropped_failing_job_reported() -> None:
    async def main() -> list[JobEvent]:
        broker = await EmbeddedBroker().start()
        port = broker.port
        host = await NodeJobHost(
            "tb", {}, {}, lambda: aiomqtt.Client("127.0.0.1", port, identifier="nodes"),
            lambda cid: MQTTBus("tb", "127.0.0.1", port, client_id=cid)).start()
        events: list[JobEvent] = []
        try:
            async with aiomqtt.Client("127.0.0.1", port, identifier="ctl") as c:
                await c.subscribe(result_topic("tb"), qos=1)
                await c.publish(run_topic("tb"), b"not json", qos=1)
                await c.publish(run_topic("tb"), b'{"v": 99}', qos=1)  # wrong schema
                # a well-formed job naming a node this host does not have: it must fail
                # with the reason, not crash the host
                spec = JobSpec(JOB_VERSION, "j1", "ring", 1000, 1, 2, 4, ["a", "b"],
                               ["a", "b"], 1, 0, False, [11, 2, 50, 1000, 1000, 5000, 3], {})
                await c.publish(run_topic("tb"), msgspec.json.encode(spec), qos=1)
                async for m in c.messages:
                    events.append(msgspec.json.decode(bytes(m.payload), type=JobEvent))
                    break
                # still serving: the same failure again for a second job
                await c.publish(run_topic("tb"), msgspec.json.encode(
                    msgspec.structs.replace(spec, job="j2")), qos=1)
                async for m in c.messages:
                    events.append(msgspec.json.decode(bytes(m.payload), type=JobEvent))
                    break
        finally:
            await host.stop()
            await broker.stop()
        return events

    events = asyncio.run(asyncio.wait_for(main(), 60))
    assert [(e.job, e.kind) for e in events] == [("j1", "failed"), ("j2", "failed")]
    assert "'a'" in events[0].error  # names what it lacks
