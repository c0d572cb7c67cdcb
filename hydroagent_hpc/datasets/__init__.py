"""Real data: CAMELS-US readers, USGS discharge, the paper's gauges, raster clipping.

Modules (one noun each): :mod:`~.units` (discharge conversions), :mod:`~.pet` (Hargreaves and
Priestley-Taylor), :mod:`~.camels` (forcing and streamflow files), :mod:`~.attributes`
(catchment attributes), :mod:`~.model_output` (the published SAC-SMA benchmark files),
:mod:`~.camels_basin` (a CAMELS basin written in our EF5 layout), :mod:`~.gauges` (the paper's
14 gauges), :mod:`~.usgs` (hourly discharge through ``dataretrieval``), :mod:`~.rasters`
(clip a grid to a basin), :mod:`~.download` (CAMELS-US from NCAR: resumable, checked, unpacked
atomically; ``hydroagent data camels``). The data manifest lives in :mod:`hydroagent_hpc.sim.manifest`
because the synthetic generator writes one too. See ``README.md`` in this folder for the
data preparation of the paper's gauges.

Layering: this package imports ``types``, ``params``, ``metrics`` and ``sim`` only.
"""
