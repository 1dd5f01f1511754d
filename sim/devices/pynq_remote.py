"""A PYNQ.remote-compatible gRPC server in front of one emulated O-NIC board.

Built on pynq's own generated servicers (pynq/remote/*_pb2_grpc), served by grpc.aio on
the emulator's event loop (so handlers touch the board on its own loop, no threads), and
bound to 127.0.0.1 unless told otherwise. Unmodified `pynq.pl_server.remote_device.
RemoteDevice(0, host, port=N)` and `pynq.MMIO(..., device=that)` reach the board through it.
Files the client asks about are a small, fixed emulated board filesystem.
"""

from __future__ import annotations

import struct

import grpc
from oddl.controller.base.devices import DeviceRefused
from oddl.sim.devices.pynq_device import EmulatedONicDevice
from pynq.remote import mmio_pb2, mmio_pb2_grpc, remote_device_pb2, remote_device_pb2_grpc

FILES = {
    "/proc/version": b"Linux version 6.1.0-oddl-emu (aarch64) #1 SMP\n",
    "/proc/device-tree/chosen/pynq_board": b"ODDL-ONIC-EMU\x00",
}


class _Device(remote_device_pb2_grpc.RemoteDeviceServicer):
    async def existsfile(self, request, context):
        return remote_device_pb2.ExistsFileResponse(exists=request.file_path in FILES)

    async def readfile(self, request, context):
        data = FILES.get(request.file_path)
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{request.file_path}: no such file")
        yield remote_device_pb2.ReadFileResponse(data=data)


class _Mmio(mmio_pb2_grpc.MmioServicer):
    def __init__(self, dev: EmulatedONicDevice) -> None:
        self.dev = dev
        self.maps: dict[str, tuple[int, int]] = {}
        self.ops = 0

    async def get_mmio(self, request, context):
        mid = f"{request.base_addr:x}+{request.length:x}"
        try:
            self.dev.read_registers(request.base_addr, 4)  # is the window mapped at all?
        except MemoryError as e:
            return mmio_pb2.GetMmioResponse(status=False, msg=str(e))
        self.maps[mid] = (request.base_addr, request.length)
        return mmio_pb2.GetMmioResponse(status=True, mmio_id=mid)

    async def read(self, request, context):
        base, length = self.maps.get(request.mmio_id, (None, 0))
        if base is None:
            return mmio_pb2.ReadResponse(status=False, msg=f"unknown mmio id {request.mmio_id}")
        if request.length != 4:  # PYNQ.remote's ReadResponse carries 32 bits
            return mmio_pb2.ReadResponse(status=False, msg=f"{request.length}-byte reads are "
                                         "not supported over PYNQ.remote (32-bit data)")
        if not 0 <= request.offset < length:
            return mmio_pb2.ReadResponse(status=False, msg=f"offset {request.offset:#x} "
                                         f"outside the {length:#x}-byte window")
        try:
            data = self.dev.read_registers(base + request.offset, 4)
        except (MemoryError, DeviceRefused) as e:
            return mmio_pb2.ReadResponse(status=False, msg=str(e))
        self.ops += 1
        return mmio_pb2.ReadResponse(status=True, data=struct.unpack("<I", data)[0])

    async def write(self, request, context):
        base, length = self.maps.get(request.mmio_id, (None, 0))
        if base is None:
            return mmio_pb2.WriteResponse(status=False, msg=f"unknown mmio id {request.mmio_id}")
        if not 0 <= request.offset < length:
            return mmio_pb2.WriteResponse(status=False, msg=f"offset {request.offset:#x} "
                                          f"outside the {length:#x}-byte window")
        try:
            self.dev.write_registers(base + request.offset, bytes(request.data))
        except (MemoryError, DeviceRefused) as e:
            return mmio_pb2.WriteResponse(status=False, msg=str(e))
        self.ops += 1
        return mmio_pb2.WriteResponse(status=True)


class RemoteBoardServer:
    def __init__(self, dev: EmulatedONicDevice, host: str = "127.0.0.1", port: int = 0) -> None:
        self.dev = dev
        self.host = host
        self.port = port
        self.server: grpc.aio.Server | None = None
        self.mmio = _Mmio(dev)

    async def start(self) -> RemoteBoardServer:
        self.server = grpc.aio.server()
        remote_device_pb2_grpc.add_RemoteDeviceServicer_to_server(_Device(), self.server)
        mmio_pb2_grpc.add_MmioServicer_to_server(self.mmio, self.server)
        self.port = self.server.add_insecure_port(f"{self.host}:{self.port}")
        await self.server.start()
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=0.5)
            self.server = None
