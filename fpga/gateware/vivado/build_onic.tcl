# The real O-NIC bitstream: a Zynq UltraScale+ PS (its board preset) with the packaged
# onic_top IP (onic_ctrl and the stage-2 control unit in its datapath) on M_AXI_HPM0_FPD and
# its interrupt on pl_ps_irq0, built by Vivado in batch mode, with a timing gate after
# routing. The Makefile beside this script runs it (docs/gateware.md):
#
#   make -C fpga/gateware/vivado BOARD=zcu104      # rtl, the packaged IP, then this
#
# which is
#
#   vivado -mode batch -source build_onic.tcl -tclargs IP_DIR OUT boards/BOARD.tcl SHA256
#
# It writes OUT/oddl_onic.bit and oddl_onic.hwh: copy both over fpga/overlays/ (or point
# `oddl node --bitfile` at them). The address map and interrupt below, and the IP's type,
# are checked against fpga/regmap.py, the driver and the shipped .hwh by
# tests/test_gateware.py (which reads this script: Vivado itself is not run in CI).
#
# The datapath: a board file (boards/BOARD.tcl) may define `proc oddl_connect_datapath
# {ip}`, which connects the IP's ports to the board's own IP: the control frames
# (ctl_rx_*/ctl_tx_*, one 512-bit AXI-Stream beat a frame) to the 100 GbE MAC of the
# control network (a CMAC USPLUS), the transfers (h_*/v_* tx, rx) to the optical ports'
# MACs, the tune commands (h_*/v_* tune) to the tunable lasers' driver, and Lightning's
# DACs (dac_*, stream_*) to the RF data converters. None of oddl's boards' files defines it
# yet (their MACs and lasers are a lab's: docs/gateware.md says which IP goes where), so the
# ports are tied off below: the bitstream builds and boots (registers, routes, the
# count-action engine, the control unit's block, interrupts) and moves no light.

set ip_name onic_top
set ip_vlnv oddl.org:oddl:onic_top:0.3
set ip_base 0xA0000000
set ip_range 0x10000
set axi_master M_AXI_HPM0_FPD
set irq_pin pl_ps_irq0
set pl_clock_mhz 250

set ipdir [lindex $argv 0]
set out [lindex $argv 1]
source [lindex $argv 2]  ;# the board: part, board_part
set design_sha256 [lindex $argv 3]  ;# the RTL's SHA-256, for the BITSTREAM_HASH strap
if {![regexp {^[0-9a-f]{64}$} $design_sha256]} {
    error "oddl: the 4th argument is the RTL's SHA-256 (64 hex digits), not '$design_sha256'"
}
file mkdir $out

create_project -force oddl_onic $out/project -part $part
set_property board_part $board_part [current_project]
set_property ip_repo_paths [list $ipdir] [current_project]
update_ip_catalog
# the board's nanosecond time base (onic_ctrl's ts_ns): a counter at PL0, 4 ns a tick
set tb [open $out/oddl_timebase.v w]
puts $tb {module oddl_timebase(input clk, input resetn, output reg [63:0] ts_ns);
  always @(posedge clk) ts_ns <= resetn ? ts_ns + 64'd4 : 64'd0;
endmodule}
close $tb
add_files -norecurse $out/oddl_timebase.v
update_compile_order -fileset sources_1

create_bd_design oddl_onic
set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:zynq_ultra_ps_e zynq_ultra_ps_e_0]
apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e \
    -config {apply_board_preset "1"} $ps  ;# the board's DDR, MIO and clocks
set_property -dict [list \
    CONFIG.PSU__USE__M_AXI_GP0 {1} CONFIG.PSU__USE__M_AXI_GP1 {0} CONFIG.PSU__USE__M_AXI_GP2 {0} \
    CONFIG.PSU__USE__IRQ0 {1} \
    CONFIG.PSU__FPGA_PL0_ENABLE {1} \
    CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ $pl_clock_mhz] $ps
set ip [create_bd_cell -type ip -vlnv $ip_vlnv $ip_name]
set timebase [create_bd_cell -type module -reference oddl_timebase oddl_timebase_0]
set reset [create_bd_cell -type ip -vlnv xilinx.com:ip:proc_sys_reset proc_sys_reset_0]

# the reset block on PL0 and the PS's PL reset: without its clock it holds every reset
# asserted for ever (ts_ns would read 0, the IP would never leave reset)
connect_bd_net [get_bd_pins zynq_ultra_ps_e_0/pl_clk0] [get_bd_pins proc_sys_reset_0/slowest_sync_clk]
connect_bd_net [get_bd_pins zynq_ultra_ps_e_0/pl_resetn0] [get_bd_pins proc_sys_reset_0/ext_reset_in]
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [list \
    Master /zynq_ultra_ps_e_0/$axi_master Slave /$ip_name/s_axi \
    Clk_master /zynq_ultra_ps_e_0/pl_clk0 Clk_slave /zynq_ultra_ps_e_0/pl_clk0 \
    Clk_xbar /zynq_ultra_ps_e_0/pl_clk0] [get_bd_intf_pins $ip_name/s_axi]
# onic_ctrl's reset is active high (its interface says so): the reset block's
# peripheral_reset, on the same clock as its AXI slave
foreach pin [get_bd_pins -quiet $ip_name/rst] {
    if {[llength [get_bd_nets -quiet -of_objects $pin]] == 0} {
        connect_bd_net [get_bd_pins proc_sys_reset_0/peripheral_reset] $pin
    }
}
connect_bd_net [get_bd_pins zynq_ultra_ps_e_0/pl_clk0] [get_bd_pins oddl_timebase_0/clk]
connect_bd_net [get_bd_pins proc_sys_reset_0/peripheral_aresetn] \
    [get_bd_pins oddl_timebase_0/resetn]
connect_bd_net [get_bd_pins oddl_timebase_0/ts_ns] [get_bd_pins $ip_name/ts_ns]
connect_bd_net [get_bd_pins $ip_name/irq] [get_bd_pins zynq_ultra_ps_e_0/$irq_pin]

# straps: a 4-node testbed, 64 channels, both ports (edit for yours; NODE_ID is
# rewritten by the driver's stage 1 anyway)
foreach {pin value width} {node_id 0 16 n_nodes 4 16 n_channels 64 8 ports_present 3 2} {
    set c [create_bd_cell -type ip -vlnv xilinx.com:ip:xlconstant const_$pin]
    set_property -dict [list CONFIG.CONST_WIDTH $width CONFIG.CONST_VAL $value] $c
    connect_bd_net [get_bd_pins const_$pin/dout] [get_bd_pins $ip_name/$pin]
}
# BITSTREAM_HASH0-7: the RTL's SHA-256, word 0 its first 4 bytes (the strap's top bits).
# A bitstream cannot hold its own hash: the Makefile writes this one beside the .bit
# (oddl_onic.design.sha256), and a lab's [acceptance] bitstream_sha256 names it
set cat [create_bd_cell -type ip -vlnv xilinx.com:ip:xlconcat hash_concat]
set_property CONFIG.NUM_PORTS 8 $cat
for {set w 0} {$w < 8} {incr w} {
    set c [create_bd_cell -type ip -vlnv xilinx.com:ip:xlconstant const_hash$w]
    set_property -dict [list CONFIG.CONST_WIDTH 32 \
        CONFIG.CONST_VAL 0x[string range $design_sha256 [expr {8 * $w}] [expr {8 * $w + 7}]]] $c
    set_property CONFIG.IN[expr {7 - $w}]_WIDTH 32 $cat
    connect_bd_net [get_bd_pins const_hash$w/dout] [get_bd_pins hash_concat/In[expr {7 - $w}]]
}
connect_bd_net [get_bd_pins hash_concat/dout] [get_bd_pins $ip_name/bitstream_hash]

# the datapath: the board's own, or tied off (inputs low, ready high: nothing arrives)
if {[llength [info procs oddl_connect_datapath]]} {
    oddl_connect_datapath $ip_name
} else {
    puts "oddl: WARNING: boards/[file tail [lindex $argv 2]] connects no datapath: the MAC, \
lasers and DACs ports of $ip_name are tied off (a bitstream that moves no light)"
    foreach pin [get_bd_pins -quiet -filter {DIR == I} $ip_name/*] {
        if {[llength [get_bd_nets -quiet -of_objects $pin]] == 0} {
            set name [get_property NAME $pin]
            set width [expr {[get_property LEFT $pin] eq "" ? 1 : [get_property LEFT $pin] + 1}]
            set value [expr {$name eq "ctl_tx_tready" ? 1 : 0}]
            set c [create_bd_cell -type ip -vlnv xilinx.com:ip:xlconstant tie_$name]
            set_property -dict [list CONFIG.CONST_WIDTH $width CONFIG.CONST_VAL $value] $c
            connect_bd_net [get_bd_pins tie_$name/dout] $pin
        }
    }
}

set seg [get_bd_addr_segs -of_objects [get_bd_addr_spaces zynq_ultra_ps_e_0/Data] \
    -filter "NAME =~ *$ip_name*"]
set_property offset $ip_base $seg
set_property range $ip_range $seg
validate_bd_design
save_bd_design

make_wrapper -files [get_files oddl_onic.bd] -top
add_files -norecurse [glob $out/project/oddl_onic.gen/sources_1/bd/oddl_onic/hdl/oddl_onic_wrapper.v]
set_property top oddl_onic_wrapper [current_fileset]
# placed and routed first; the timing gate before any bitstream: every net routed, no
# negative slack (setup or hold) at pl_clock_mhz; the timing summary kept beside the .bit
launch_runs impl_1 -to_step route_design -jobs 4
wait_on_run impl_1
if {[get_property PROGRESS [get_runs impl_1]] != "100%"} {
    error "oddl: implementation did not finish: see $out/project/oddl_onic.runs/impl_1"
}
open_run impl_1
report_timing_summary -max_paths 20 -file $out/oddl_onic.timing.rpt
report_route_status -file $out/oddl_onic.route.rpt
set wns [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -setup]]
set whs [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -hold]]
set unrouted [llength [get_nets -quiet -hierarchical -top_net_of_hierarchical_group \
    -filter {ROUTE_STATUS != ROUTED && ROUTE_STATUS != INTRASITE && TYPE == SIGNAL}]]
puts "oddl: timing at $pl_clock_mhz MHz: WNS $wns ns, WHS $whs ns; $unrouted nets unrouted"
if {$wns eq "" || $wns < 0 || $whs eq "" || $whs < 0 || $unrouted > 0} {
    error "oddl: timing not met at $pl_clock_mhz MHz (WNS $wns ns, WHS $whs ns, $unrouted \
unrouted nets): no bitstream; see $out/oddl_onic.timing.rpt"
}
launch_runs impl_1 -to_step write_bitstream -jobs 4
wait_on_run impl_1
if {[get_property PROGRESS [get_runs impl_1]] != "100%"} {
    error "oddl: the bitstream was not written: see $out/project/oddl_onic.runs/impl_1"
}

file copy -force [glob $out/project/oddl_onic.runs/impl_1/*.bit] $out/oddl_onic.bit
file copy -force [glob $out/project/oddl_onic.gen/sources_1/bd/oddl_onic/hw_handoff/oddl_onic.hwh] \
    $out/oddl_onic.hwh
puts "oddl: wrote $out/oddl_onic.bit and $out/oddl_onic.hwh (timing: $out/oddl_onic.timing.rpt)"
