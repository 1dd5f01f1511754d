# ZCU111 (Zynq UltraScale+ RFSoC XCZU28DR): the O-NIC beside QICK's RFSoC (Lightning)
set part xczu28dr-ffvg1517-2-e
set board_part xilinx.com:zcu111:part0:1.4
