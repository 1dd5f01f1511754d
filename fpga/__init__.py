"""The software/FPGA contract of the O-NIC: register map, count-action language, overlays.

The register map and the count-action compiler land with the FPGA issue; until then the
controller reaches O-NICs through `controller.devices.ONic`.
"""
