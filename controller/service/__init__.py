"""The arbiter at run time: `admission` (the one orchestration of jobs: arrivals,
placement, stage 1 per job, stops for faults), sharing `jobtable` (what it knows of each
job) with `alignment` (CASSINI's placements, start delays and pauses) and `deadlines`
(the service's time limits), over `jobs` (a job's request and record),
`placing` (where a job goes) and `stages` (the stage 1 it applies), `stage1_io`
(that stage 1's device I/O off the loop, and the watch kept out of its way), `recovery` (what a
fault costs and where a job goes on), `health` (the live inventory), `backend` (the
interface every back end implements), `drill` (when a drill's faults begin), `node` (the
node program beside each O-NIC), `watchers` (what the bus's watchers are told of a run)
and `lock` (the testbed lock). Imports the core below
it, never a back end."""
