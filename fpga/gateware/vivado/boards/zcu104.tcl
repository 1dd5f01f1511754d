# ZCU104 (Zynq UltraScale+ XCZU7EV): oddl's reference board for the O-NIC
set part xczu7ev-ffvc1156-2-e
set board_part xilinx.com:zcu104:part0:1.1
