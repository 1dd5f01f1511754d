"""The seed systems' models that are studies, not back ends: OptINC's optical network
(`onn`), its MZI meshes (`mzi`) and data-parallel training through it (`training`).
Imports the control plane's `base` only."""
