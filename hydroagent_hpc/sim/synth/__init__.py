"""Synthetic twin basins: terrain, storms, PET, a-priori parameter grids and a hidden truth.

:mod:`~hydroagent_hpc.sim.synth.basins` assembles them into EF5 basin folders
(``hydroagent basin synth``, the demo's four basins modelled on the paper's held-out gauges).
"""
