"""The seed systems' models that are studies, not back ends: OptINC's optical network
(`onn`), its MZI meshes (`mzi`), the trained ONN that averages and quantises
(`quantiser`) and data-parallel training through them (`training`);
Lightning's inference (`lenet`: the network, three ways, its count-action DAG), its
latency and energy as the talk accounts them (`lightning_cost`) and its serve time by its
own setup (`lightning_serve`); `arrays` names the arrays they pass by what they hold.
Imports the control plane's `base` and
the fpga's count-action language only; devices (a QICK board, an O-NIC engine) are handed
in."""
