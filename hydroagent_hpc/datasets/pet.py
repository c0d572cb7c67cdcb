"""Potential evapotranspiration (mm/day) from daily basin-mean forcing.

CAMELS forcing has no PET column, and which method fits depends on the file:

* **Hargreaves** (Hargreaves and Samani 1985, Appl. Eng. Agric. 1(2), 96-99; FAO-56 eq. 52):
  ``PET = 0.0023 * Ra/lambda * (Tmean + 17.8) * sqrt(Tmax - Tmin)`` with ``Ra`` the
  extraterrestrial radiation. It needs a real diurnal range.
* **Priestley-Taylor** (Priestley and Taylor 1972, Mon. Weather Rev. 100, 81-92; net radiation
  as in FAO-56, Allen et al. 1998, eqs. 7, 8, 13, 21, 37-39):
  ``PET = alpha * Delta/(Delta+gamma) * Rn/lambda`` with ``alpha = 1.26``, ``G = 0`` (daily),
  ``Rn = (1-0.23) Rs - sigma*T^4*(0.34-0.14*sqrt(ea))*(1.35*Rs/Rso-0.35)``. It needs shortwave
  radiation, vapour pressure and elevation, which every CAMELS forcing file has.

The original CAMELS NLDAS and Maurer files repeat the daily mean temperature in both Tmax and
Tmin (``PROVENANCE.md`` of the shared data), so ``sqrt(Tmax-Tmin)`` would be 0 and Hargreaves
would give no evaporation at all: :func:`choose_method` picks Priestley-Taylor for such files
and Hargreaves where the range is real (Daymet, ``maurer_extended``).

Shortwave: CAMELS ``srad`` is the mean flux over the daylight period (Daymet's convention), so
the daily total is ``Rs = srad * dayl / 1e6`` MJ/m2; it is capped at the clear-sky ``Rso`` in
the cloudiness term only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["extraterrestrial_radiation", "hargreaves", "priestley_taylor", "has_diurnal_range", "choose_method",
           "LAMBDA_MJ_KG", "PT_ALPHA"]

LAMBDA_MJ_KG = 2.45  # latent heat of vaporisation (FAO-56), MJ/kg: 1 mm of water = 2.45 MJ/m2
PT_ALPHA = 1.26
_GSC = 0.0820  # solar constant, MJ/m2/min
_SIGMA = 4.903e-9  # Stefan-Boltzmann, MJ/K4/m2/day
_ALBEDO = 0.23


def extraterrestrial_radiation(lat_deg: float, doy) -> np.ndarray:
    """Daily extraterrestrial radiation ``Ra`` (MJ/m2/day), FAO-56 eqs. 21-25.

    ``Ra = 24*60/pi * Gsc * dr * (ws sin(phi) sin(delta) + cos(phi) cos(delta) sin(ws))``,
    ``dr = 1 + 0.033 cos(2 pi J/365)``, ``delta = 0.409 sin(2 pi J/365 - 1.39)``,
    ``ws = arccos(-tan(phi) tan(delta))`` (clipped for polar day and night).
    """
    j = np.asarray(doy, dtype=np.float64)
    phi = np.radians(float(lat_deg))
    dr = 1.0 + 0.033 * np.cos(2.0 * np.pi * j / 365.0)
    delta = 0.409 * np.sin(2.0 * np.pi * j / 365.0 - 1.39)
    ws = np.arccos(np.clip(-np.tan(phi) * np.tan(delta), -1.0, 1.0))
    return 24.0 * 60.0 / np.pi * _GSC * dr * (ws * np.sin(phi) * np.sin(delta)
                                             + np.cos(phi) * np.cos(delta) * np.sin(ws))


def hargreaves(tmax_c, tmin_c, lat_deg: float, doy) -> np.ndarray:
    """Hargreaves PET (mm/day): ``0.0023 * Ra/2.45 * (Tmean + 17.8) * sqrt(Tmax - Tmin)``, floored at 0."""
    tmax = np.asarray(tmax_c, dtype=np.float64)
    tmin = np.asarray(tmin_c, dtype=np.float64)
    ra_mm = extraterrestrial_radiation(lat_deg, doy) / LAMBDA_MJ_KG
    tmean = (tmax + tmin) / 2.0
    pet = 0.0023 * ra_mm * (tmean + 17.8) * np.sqrt(np.maximum(tmax - tmin, 0.0))
    return np.maximum(pet, 0.0)


def _svp(t_c: np.ndarray) -> np.ndarray:
    """Saturation vapour pressure (kPa), FAO-56 eq. 11."""
    return 0.6108 * np.exp(17.27 * t_c / (t_c + 237.3))


def priestley_taylor(tmax_c, tmin_c, srad_w_m2, dayl_s, vp_pa, elev_m: float, lat_deg: float, doy,
                     alpha: float = PT_ALPHA) -> np.ndarray:
    """Priestley-Taylor PET (mm/day), floored at 0 (see the module docstring for the formula).

    ``Delta`` (FAO-56 eq. 13) at the mean temperature; ``gamma = 0.000665 P`` with
    ``P = 101.3 ((293 - 0.0065 z)/293)^5.26`` kPa (eqs. 7-8); ``Rso = (0.75 + 2e-5 z) Ra``
    (eq. 37); the longwave term averages ``Tmax^4`` and ``Tmin^4`` (equal when the file has no
    diurnal range).
    """
    tmax = np.asarray(tmax_c, dtype=np.float64)
    tmin = np.asarray(tmin_c, dtype=np.float64)
    tmean = (tmax + tmin) / 2.0
    rs = np.asarray(srad_w_m2, dtype=np.float64) * np.asarray(dayl_s, dtype=np.float64) / 1e6
    ea = np.maximum(np.asarray(vp_pa, dtype=np.float64) / 1000.0, 0.0)
    ra = extraterrestrial_radiation(lat_deg, doy)
    rso = (0.75 + 2e-5 * float(elev_m)) * ra
    ratio = np.clip(np.divide(rs, rso, out=np.ones_like(rs), where=rso > 0), 0.25, 1.0)
    t4 = ((tmax + 273.16) ** 4 + (tmin + 273.16) ** 4) / 2.0
    rnl = _SIGMA * t4 * (0.34 - 0.14 * np.sqrt(ea)) * (1.35 * ratio - 0.35)
    rn = (1.0 - _ALBEDO) * rs - rnl
    delta = 4098.0 * _svp(tmean) / (tmean + 237.3) ** 2
    pressure = 101.3 * ((293.0 - 0.0065 * float(elev_m)) / 293.0) ** 5.26
    gamma = 0.000665 * pressure
    pet = alpha * delta / (delta + gamma) * rn / LAMBDA_MJ_KG
    return np.maximum(pet, 0.0)


def has_diurnal_range(tmax_c, tmin_c, tolerance_c: float = 0.01, share: float = 0.5) -> bool:
    """True when Tmax exceeds Tmin by more than ``tolerance_c`` on more than ``share`` of the days."""
    tmax = np.asarray(tmax_c, dtype=np.float64)
    tmin = np.asarray(tmin_c, dtype=np.float64)
    ok = np.isfinite(tmax) & np.isfinite(tmin)
    if not ok.any():
        return False
    return float(np.mean((tmax[ok] - tmin[ok]) > tolerance_c)) > share


def choose_method(tmax_c, tmin_c) -> str:
    """``"hargreaves"`` where the file has a diurnal range, else ``"priestley_taylor"``."""
    return "hargreaves" if has_diurnal_range(tmax_c, tmin_c) else "priestley_taylor"
