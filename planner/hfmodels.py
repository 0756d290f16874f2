"""Model files `ckplan profile --hf-config` wrote before the move import `model_file` from here:
they keep building (planner/models/hfmodels.py is the module)."""

from planner.models.hfmodels import model_file  # noqa: F401
