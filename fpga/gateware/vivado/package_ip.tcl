# Packages onic_top (Amaranth's Verilog, `oddl gateware verilog --top onic_top`: onic_ctrl
# with the stage-2 control unit in its datapath) as the IP the driver's overlay check wants:
# oddl.org:oddl:onic_top:<design version> (fpga/overlay.py check_ip_dict). A module
# reference would be named xilinx.com:module_ref:onic_top:1.0, and the driver refuses that
# .hwh. Run by the Makefile:
#
#   vivado -mode batch -source package_ip.tcl -tclargs RTL IP_DIR PART
#
# Not run in oddl's CI (no Vivado there): tests/test_gateware.py reads this script and holds
# its VLNV, interfaces and address block to the driver, fpga/regmap.py and the shipped .hwh.

set ip_vendor oddl.org
set ip_library oddl
set ip_name onic_top
set ip_version 0.3
set ip_range 0x10000

set rtl [lindex $argv 0]
set ipdir [lindex $argv 1]
set part [lindex $argv 2]
file mkdir $ipdir

create_project -force package_onic $ipdir/project -part $part
add_files -norecurse $rtl
set_property top $ip_name [current_fileset]
update_compile_order -fileset sources_1
ipx::package_project -root_dir $ipdir -vendor $ip_vendor -library $ip_library \
    -taxonomy /UserIP -import_files -set_current true
set core [ipx::current_core]
set_property name $ip_name $core
set_property version $ip_version $core
set_property display_name "oddl O-NIC (registers, routes, count-action, control unit)" $core

# The clock and the reset as interfaces, the AXI4-Lite slave (s_axi_*) on that clock.
# Amaranth's reset is synchronous and active high: the block design drives it from
# proc_sys_reset's peripheral_reset, never from an active-low aresetn.
ipx::infer_bus_interface clk xilinx.com:signal:clock_rtl:1.0 $core
ipx::infer_bus_interface rst xilinx.com:signal:reset_rtl:1.0 $core
set rst_if [ipx::get_bus_interfaces rst -of_objects $core]
ipx::add_bus_parameter POLARITY $rst_if
set_property value ACTIVE_HIGH [ipx::get_bus_parameters POLARITY -of_objects $rst_if]
ipx::associate_bus_interfaces -busif s_axi -clock clk $core
ipx::associate_bus_interfaces -clock clk -reset rst $core

# The control frames toward the control network's MAC: AXI-Stream, on the IP's clock
foreach bus {ctl_rx ctl_tx} {
    ipx::infer_bus_interface $bus xilinx.com:interface:axis_rtl:1.0 $core
    ipx::associate_bus_interfaces -busif $bus -clock clk $core
}

# The interrupt: level, active high (the driver clears IRQ_STATUS to drop it)
ipx::infer_bus_interface irq xilinx.com:signal:interrupt_rtl:1.0 $core
set irq_if [ipx::get_bus_interfaces irq -of_objects $core]
ipx::add_bus_parameter SENSITIVITY $irq_if
set_property value LEVEL_HIGH [ipx::get_bus_parameters SENSITIVITY -of_objects $irq_if]

# The register window: 64 KiB (fpga/regmap.py IP_RANGE)
set block [ipx::get_address_blocks -of_objects [ipx::get_memory_maps s_axi -of_objects $core]]
set_property range $ip_range $block

ipx::create_xgui_files $core
ipx::update_checksums $core
ipx::check_integrity $core
ipx::save_core $core
puts "oddl: packaged $ip_vendor:$ip_library:$ip_name:$ip_version in $ipdir"
