"""The arbiter at run time: the one orchestration of jobs (`admission`: arrivals, placement,
stage 1 per job, stops for faults, recovery), the live inventory (`health`), the
back-end interface every back end implements (`backend`), the node program beside each
O-NIC, the testbed lock and CASSINI's compatibility. Imports the core below it
(`stage2`, `stage1`, `base`) and `oddl.fpga`, never a back end."""
