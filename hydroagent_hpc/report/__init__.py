"""Reports: a campaign's HDF5 store -> Markdown, one self-contained HTML page, PNG figures, CSV tables.

``write_report(store, out)`` (the ``hydroagent report`` command) writes ``report.md``,
``report.html``, ``figures/*.png`` and ``tables/*.csv``: best NSE per agent and basin with
Moriasi bands and panel statistics, running-best curves, each basin's best hydrograph, a
comparison of two agents, parameter recovery on synthetic basins, and the HydroAgent paper's
published numbers where a basin is one of its gauges (labelled published, not measured).
Modules: ``results`` (reading the store), ``tables``, ``recovery``, ``published``,
``hydrograph``, ``figures``, ``sections``, ``document`` (Markdown/HTML), ``build``.
"""

from hydroagent_hpc.report.build import Report, default_comparison, write_report
from hydroagent_hpc.report.results import CampaignResults, load_results

__all__ = ["write_report", "Report", "default_comparison", "load_results", "CampaignResults"]
