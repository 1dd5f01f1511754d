"""Real device I/O, one module per device kind (pynq O-NIC, pyserial WSS, qick, MQTT).

Drivers speak to hardware or to an emulator at the device boundary; they never import sim.
"""
